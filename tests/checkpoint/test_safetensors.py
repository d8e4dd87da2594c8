"""The safetensors reader and writer: round trips of every dtype (float8 and bfloat16 as
ml_dtypes arrays), the header layout, partial reads, a cross-check against the
`safetensors` package for the dtypes NumPy has, and every kind of damaged file."""

from __future__ import annotations

import itertools
import json
import struct

import ml_dtypes
import numpy as np
import pytest
from _util import assert_same_bits

from cuquant.checkpoint.safetensors import (
    DTYPES,
    SafetensorsError,
    SafetensorsFile,
    SafetensorsWriter,
    TensorSpec,
    dtype_name,
    load_file,
    save_file,
)


def raw_header(path):
    """(header dict, header length) read straight from the bytes, independently of the
    module under test."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), n


def _random(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    # floats of every width (ml_dtypes included): random bit patterns, NaNs and all
    bits = rng.integers(0, 256, size=(int(np.prod(shape)) * dt.itemsize,), dtype=np.uint8)
    return bits.view(dt).reshape(shape)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_round_trip_every_dtype(tmp_path, rng, name):
    dt = DTYPES[name]
    tensors = {"a.weight": _random(rng, dt, (7, 13)), "b": _random(rng, dt, (3,)),
               "scalar": _random(rng, dt, ()), "empty": _random(rng, dt, (0, 5))}
    path = tmp_path / "x.safetensors"
    save_file(tensors, path, {"format": "pt", "note": "héllo"})
    hdr, _ = raw_header(path)
    assert hdr["__metadata__"] == {"format": "pt", "note": "héllo"}
    assert {hdr[k]["dtype"] for k in tensors} == {name}
    back = load_file(path)
    assert set(back) == set(tensors)
    for k, a in tensors.items():
        assert back[k].dtype == dt
        assert_same_bits(back[k], a, k)


def test_float8_comes_back_as_ml_dtypes(tmp_path):
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16).view(ml_dtypes.float8_e4m3fn)
    save_file({"w": codes}, tmp_path / "f.safetensors")
    hdr, _ = raw_header(tmp_path / "f.safetensors")
    assert hdr["w"] == {"dtype": "F8_E4M3", "shape": [16, 16], "data_offsets": [0, 256]}
    back = load_file(tmp_path / "f.safetensors")["w"]
    assert back.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert_same_bits(back, codes)


def test_header_layout(tmp_path, rng):
    tensors = {"z.u8": _random(rng, np.uint8, (3, 3)), "a.f32": _random(rng, np.float32, (5,)),
               "m.bf16": _random(rng, ml_dtypes.bfloat16, (3,)), "b.f64": _random(rng, np.float64, (1,))}
    path = tmp_path / "x.safetensors"
    save_file(tensors, path)
    hdr, n = raw_header(path)
    raw = path.read_bytes()
    assert n % 8 == 0
    assert raw[8:8 + n].decode().endswith("}" + " " * (n - len(raw[8:8 + n].decode().rstrip())))
    spans = sorted(v["data_offsets"] for v in hdr.values())
    assert spans[0][0] == 0
    for (_, e0), (b1, _) in itertools.pairwise(spans):
        assert b1 == e0  # back to back, no gaps (the reference loader insists)
    assert 8 + n + spans[-1][1] == len(raw)
    for v in hdr.values():  # each tensor aligned to its item size
        assert (8 + n + v["data_offsets"][0]) % DTYPES[v["dtype"]].itemsize == 0


def test_read_rows_and_bytes(tmp_path, rng):
    a = rng.standard_normal((300, 7)).astype(np.float32)
    save_file({"a": a, "b": a[:2].astype(np.float16)}, tmp_path / "x.safetensors")
    with SafetensorsFile(tmp_path / "x.safetensors") as f:
        assert_same_bits(f.read_rows("a", 17, 129), a[17:129])
        assert f.read_rows("a", 5, 5).shape == (0, 7)
        assert f.read_bytes("a", 28, 28) == a[1].tobytes()
        assert f.tensors["a"].shape == (300, 7) and f.tensors["a"].nbytes == a.nbytes


def test_writer_streams_pieces(tmp_path, rng):
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = np.arange(10, dtype=np.int64)
    specs = [TensorSpec("a", "F32", (64, 8)), TensorSpec("b", "I64", (10,))]
    with SafetensorsWriter(tmp_path / "x.safetensors", specs, {"format": "pt"}) as w:
        for r in range(0, 64, 10):  # a in uneven pieces, b in between
            w.write("a", a[r:r + 10])
            if r == 20:
                w.write("b", b)
    back = load_file(tmp_path / "x.safetensors")
    assert_same_bits(back["a"], a)
    assert_same_bits(back["b"], b)


def test_unknown_dtype_passes_through(tmp_path):
    specs = [TensorSpec("packed", "F4", (4, 4), nbytes=8), TensorSpec("x", "F32", (2,))]
    with SafetensorsWriter(tmp_path / "x.safetensors", specs) as w:
        w.write("packed", bytes(range(8)))
        w.write("x", np.ones(2, np.float32))
    with SafetensorsFile(tmp_path / "x.safetensors") as f:
        assert f.tensors["packed"].dtype == "F4"
        assert f.read_bytes("packed") == bytes(range(8))
        with pytest.raises(SafetensorsError, match="F4"):
            f.read("packed")


def test_writer_refuses_mismatches(tmp_path):
    specs = [TensorSpec("a", "F32", (4,))]
    w = SafetensorsWriter(tmp_path / "x.safetensors", specs)
    with pytest.raises(SafetensorsError, match="more than"):
        w.write("a", np.zeros(5, np.float32))
    w.write("a", np.zeros(2, np.float32))
    with pytest.raises(SafetensorsError, match="incomplete"):
        w.close()
    with pytest.raises(SafetensorsError, match="duplicate"):
        SafetensorsWriter(tmp_path / "y.safetensors", specs * 2)
    with pytest.raises(SafetensorsError, match="strings"):
        save_file({"a": np.zeros(1)}, tmp_path / "z.safetensors", {"k": 1})
    with pytest.raises(SafetensorsError):
        dtype_name(np.dtype("U4"))


# ---------------------------------------------------------------------------------------
# Cross-check against the reference package (dtypes NumPy has; it cannot load float8)

_NUMPY_NATIVE = ["F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL"]


def test_reference_package_reads_ours_and_we_read_theirs(tmp_path, rng):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {f"t.{n.lower()}": _random(rng, DTYPES[n], (5, 3)) for n in _NUMPY_NATIVE}
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    ours = tmp_path / "ours.safetensors"
    save_file(tensors, ours, {"format": "np"})
    theirs_back = st.load_file(str(ours))
    for k, a in tensors.items():
        assert_same_bits(theirs_back[k], a, k)
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(tensors, str(theirs), metadata={"format": "np"})
    ours_back = load_file(theirs)
    for k, a in tensors.items():
        assert_same_bits(ours_back[k], a, k)
    with SafetensorsFile(theirs) as f:
        assert f.metadata == {"format": "np"}
    ho, _ = raw_header(ours)
    ht, _ = raw_header(theirs)
    for k in tensors:  # same dtypes and shapes (the order of the data may differ)
        assert (ho[k]["dtype"], ho[k]["shape"]) == (ht[k]["dtype"], ht[k]["shape"])


# ---------------------------------------------------------------------------------------
# Damaged files

def _file_with_header(path, header: bytes, data: bytes = b"", length: int | None = None):
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def _hdr(obj) -> bytes:
    return json.dumps(obj).encode()


_GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}

_DAMAGED = {
    "empty file": (b"", None, b"", "truncated"),
    "short length": (b"\x01\x02\x03", None, b"", "truncated"),
    "huge length": (b"{}", 1 << 40, b"", "claims"),
    "length past the end": (_hdr(_GOOD), 4096, b"\0" * 8, "truncated header"),
    "not json": (b"{not json", None, b"", "not valid JSON"),
    "not utf-8": (b"\xff\xfe{}", None, b"", "not valid JSON"),
    "json list": (b"[1, 2]", None, b"", "not an object"),
    "entry not object": (_hdr({"a": 3}), None, b"", "not an object"),
    "no dtype": (_hdr({"a": {"shape": [2], "data_offsets": [0, 8]}}), None, b"\0" * 8, "no dtype"),
    "bad shape": (_hdr({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}), None,
                  b"\0" * 8, "shape"),
    "bad offsets": (_hdr({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}), None,
                    b"\0" * 8, "data_offsets"),
    "size mismatch": (_hdr({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}), None,
                      b"\0" * 8, "needs 12 bytes"),
    "data truncated": (_hdr(_GOOD), None, b"\0" * 5, "truncated"),
    "overlap": (_hdr({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}), None,
                b"\0" * 12, "overlap"),
    "metadata not strings": (_hdr({"__metadata__": {"k": 1}, **_GOOD}), None, b"\0" * 8,
                             "__metadata__"),
}


@pytest.mark.parametrize("case", sorted(_DAMAGED))
def test_damaged_files_raise_clearly(tmp_path, case):
    header, length, data, message = _DAMAGED[case]
    path = _file_with_header(tmp_path / "bad.safetensors", header, data, length)
    if case in ("empty file", "short length"):
        path.write_bytes(header)
    with pytest.raises(SafetensorsError, match=message) as e:
        SafetensorsFile(path)
    assert str(path) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        SafetensorsFile(tmp_path / "nope.safetensors")
