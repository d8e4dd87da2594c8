"""A small, streaming reader and writer of the safetensors format, in Python and NumPy.

The format: an 8-byte little-endian unsigned header length N, then N bytes of JSON (padded
with spaces so the data starts at a multiple of 8), then the raw little-endian data. The
JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
relative to the start of the data) and may hold ``"__metadata__"``, a string-to-string map.

Why our own: the checkpoint tools read one tensor (or a band of rows of one) at a time
and write each output tensor as it is produced, so host memory stays near one chunk, not
one model; and NumPy has no float8 type, so the ``safetensors`` package's NumPy API cannot
load F8_E4M3 tensors. Here they come back as ``ml_dtypes.float8_e4m3fn`` arrays.

Reads use plain file reads at the header's offsets (no memory map: mapped pages count
toward the resident size of the process, and a model is far larger than a chunk).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES",
    "SafetensorsError",
    "SafetensorsFile",
    "SafetensorsWriter",
    "TensorInfo",
    "TensorSpec",
    "dtype_name",
    "load_file",
    "numpy_dtype",
    "save_file",
]

# The dtypes cuquant interprets, by their safetensors names. Others (F4, F6_*) are carried
# through untouched as bytes.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    DTYPES["F8_E8M0"] = np.dtype(ml_dtypes.float8_e8m0fnu)

_BY_NUMPY = {dt: name for name, dt in DTYPES.items()}
_BY_NUMPY.update({np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
                  np.dtype(np.float64): "F64"})

MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit too
_ALIGN = 8


# Positional reads (POSIX preadv): several threads read one file at once.
_POSITIONAL = hasattr(os, "preadv")


class SafetensorsError(ValueError):
    """A file that is not valid safetensors (truncated, corrupt header, bad offsets), or a
    write that does not match the header it announced."""


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy (or ml_dtypes) dtype of a safetensors dtype name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise SafetensorsError(f"dtype {name!r} has no NumPy equivalent here; known: "
                               f"{', '.join(DTYPES)}") from None


def dtype_name(dtype) -> str:
    """The safetensors name of a NumPy dtype (float8, bfloat16 from ml_dtypes included)."""
    dt = np.dtype(dtype)
    try:
        return _BY_NUMPY[dt.newbyteorder("<") if dt.byteorder == ">" else dt]
    except KeyError:
        raise SafetensorsError(f"NumPy dtype {dt} has no safetensors name") from None


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    dt = DTYPES.get(dtype)
    return None if dt is None else math.prod(shape) * dt.itemsize


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``begin``/``end`` are absolute byte offsets in ``path``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    path: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor a writer will receive: its name, safetensors dtype and shape. ``nbytes``
    is needed only for dtypes this module does not know (carried through as bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int | None = None

    def size(self) -> int:
        n = _nbytes(self.dtype, self.shape)
        if n is None:
            if self.nbytes is None:
                raise SafetensorsError(f"tensor {self.name!r}: dtype {self.dtype} needs an "
                                       "explicit byte size")
            return self.nbytes
        return n

    def itemsize(self) -> int:
        dt = DTYPES.get(self.dtype)
        return 1 if dt is None else dt.itemsize


# ---------------------------------------------------------------------------------------
# Reading

class SafetensorsFile:
    """One safetensors file, its header parsed and checked; tensors read on demand.

    Parameters
    ----------
    path : str or os.PathLike

    Attributes
    ----------
    tensors : dict[str, TensorInfo]
        In the header's order.
    metadata : dict[str, str]
        The ``__metadata__`` map (empty when absent).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        The file cannot be opened.
    SafetensorsError
        The file is truncated, or its header is not valid safetensors.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._f = open(self.path, "rb")  # noqa: SIM115 - held until close()
        try:
            self._parse()
        except BaseException:
            self._f.close()
            raise

    def _fail(self, what: str):
        raise SafetensorsError(f"{self.path}: {what}")

    def _parse(self) -> None:
        size = os.fstat(self._f.fileno()).st_size
        head = self._f.read(8)
        if len(head) < 8:
            self._fail(f"truncated: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            self._fail(f"corrupt header: it claims {n} bytes (the limit is {MAX_HEADER}); "
                       "not a safetensors file?")
        if 8 + n > size:
            self._fail(f"truncated header: it claims {n} bytes but the file holds only "
                       f"{size - 8} after the length")
        raw = self._f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._fail(f"corrupt header: not valid JSON ({e})")
        if not isinstance(header, dict):
            self._fail("corrupt header: the JSON is not an object")
        self.data_start = 8 + n
        data_len = size - self.data_start
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            self._fail("corrupt header: __metadata__ must map strings to strings")
        self.metadata: dict[str, str] = dict(meta)
        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, entry in header.items():
            info = self._entry(name, entry, data_len)
            self.tensors[name] = info
            spans.append((info.begin, info.end, name))
        spans.sort()
        for (_, e0, a), (b1, _, b) in itertools.pairwise(spans):
            if b1 < e0:
                self._fail(f"corrupt header: tensors {a!r} and {b!r} overlap")

    def _entry(self, name: str, entry, data_len: int) -> TensorInfo:
        if not isinstance(entry, dict):
            self._fail(f"corrupt header: entry {name!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            self._fail(f"corrupt header: tensor {name!r} has no dtype")
        if not (isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            self._fail(f"corrupt header: tensor {name!r} has shape {shape!r}, not a list of "
                       "non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            self._fail(f"corrupt header: tensor {name!r} has data_offsets {offsets!r}")
        b, e = offsets
        want = _nbytes(dtype, tuple(shape))
        if want is not None and e - b != want:
            self._fail(f"corrupt header: tensor {name!r} ({dtype} {shape}) needs {want} bytes "
                       f"but its offsets span {e - b}")
        if e > data_len:
            self._fail(f"truncated: tensor {name!r} ends at data byte {e} but the file holds "
                       f"only {data_len} bytes of data")
        return TensorInfo(name, dtype, tuple(shape), self.data_start + b, self.data_start + e,
                          self.path)

    # -- reading data ------------------------------------------------------------------

    def _pread(self, view: memoryview, at: int) -> int:
        """Read into `view` from file offset `at`; positional where the system has it, so
        that threads reading one file need no shared position. Returns the bytes read."""
        if _POSITIONAL:
            fd, got = self._f.fileno(), 0
            while got < len(view):
                n = os.preadv(fd, [view[got:]], at + got)
                if n == 0:
                    break
                got += n
            return got
        with self._lock:
            self._f.seek(at)
            return self._f.readinto(view)

    def _read_into(self, buf: np.ndarray, at: int) -> None:
        view = memoryview(buf.reshape(-1).view(np.uint8))
        got = self._pread(view, at)
        if got != len(view):
            self._fail(f"truncated: wanted {len(view)} bytes at offset {at}, read {got}")

    def read(self, name: str) -> np.ndarray:
        """The whole tensor as a NumPy array (float8 and bfloat16 as ml_dtypes types)."""
        info = self.tensors[name]
        return self.read_rows(name, 0, info.shape[0] if info.shape else 1)

    def read_rows(self, name: str, r0: int, r1: int, alloc=np.empty) -> np.ndarray:
        """Rows ``r0:r1`` of the first axis (a 0-d tensor has one row, itself), read into
        ``alloc(shape, dtype)`` (an uninitialized array, e.g. in page-locked memory)."""
        info = self.tensors[name]
        dt = numpy_dtype(info.dtype)
        if not info.shape:
            out = np.empty((), dtype=dt)
            self._read_into(out, info.begin)
            return out
        row = math.prod(info.shape[1:])
        out = alloc((r1 - r0,) + info.shape[1:], dt)
        if out.size:
            self._read_into(out, info.begin + r0 * row * dt.itemsize)
        return out

    def read_bytes(self, name: str, offset: int = 0, size: int | None = None) -> bytearray:
        """Raw bytes of a tensor (any dtype, known or not), from `offset` within it."""
        info = self.tensors[name]
        size = info.nbytes - offset if size is None else size
        data = bytearray(size)
        if self._pread(memoryview(data), info.begin + offset) != size:
            self._fail(f"truncated: tensor {name!r} is cut short")
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_file(path) -> dict[str, np.ndarray]:
    """Every tensor of a file as NumPy arrays (a convenience for small files and tests)."""
    with SafetensorsFile(path) as f:
        return {name: f.read(name) for name in f.tensors}


# ---------------------------------------------------------------------------------------
# Writing

def layout(specs: Iterable[TensorSpec]) -> list[tuple[TensorSpec, int, int]]:
    """Data offsets of each tensor: widest dtype first, then by name, back to back, the
    order the reference writer uses, so every tensor is aligned to its own item size (the
    data itself starts at a multiple of 8)."""
    out, at = [], 0
    for spec in sorted(specs, key=lambda s: (-s.itemsize(), s.name)):
        n = spec.size()
        out.append((spec, at, at + n))
        at += n
    return out


def header_bytes(placed, metadata: Mapping[str, str] | None) -> bytes:
    """The length prefix and the JSON header, padded with spaces to a multiple of 8."""
    header: dict = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise SafetensorsError(f"metadata must map strings to strings; bad keys: {bad}")
        header["__metadata__"] = dict(metadata)
    for spec, b, e in placed:
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [b, e]}
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsWriter:
    """Write a safetensors file tensor by tensor, each in as many pieces as wanted.

    The header is written first, from the specs (names, dtypes, shapes), so no tensor is
    ever held whole: `write` appends the next bytes of one tensor at its place in the file.

    Parameters
    ----------
    path : str or os.PathLike
        Created (or truncated).
    specs : iterable of TensorSpec
    metadata : mapping of str to str, optional
        Stored as ``__metadata__``.
    """

    def __init__(self, path, specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None = None):
        specs = list(specs)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise SafetensorsError(f"duplicate tensor names: {dup}")
        if "__metadata__" in names:
            raise SafetensorsError("'__metadata__' cannot be a tensor name")
        placed = layout(specs)
        head = header_bytes(placed, metadata)
        self.path = os.fspath(path)
        self.data_start = len(head)
        self._place = {spec.name: (spec, b, e) for spec, b, e in placed}
        self._done = {name: 0 for name in self._place}
        self.nbytes = self.data_start + (placed[-1][2] if placed else 0)
        self._f = open(self.path, "wb")  # noqa: SIM115 - held until close()
        try:
            self._f.write(head)
        except BaseException:
            self._f.close()
            raise

    def write(self, name: str, data) -> None:
        """Append the next bytes of tensor `name`: a NumPy array (any dtype, written as its
        raw C-order bytes) or a bytes-like object."""
        _, b, e = self._place[name]
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        buf = memoryview(data).cast("B")
        at = b + self._done[name]
        if at + len(buf) > e:
            raise SafetensorsError(f"{self.path}: tensor {name!r} gets {self._done[name] + len(buf)}"
                                   f" bytes, more than its {e - b}")
        self._f.seek(self.data_start + at)
        self._f.write(buf)
        self._done[name] += len(buf)

    def close(self) -> None:
        """Check every tensor got all its bytes, then flush and close the file. The data is
        left to the operating system to put on the disk (no fsync), as `cp` leaves it."""
        missing = [n for n, (_, b, e) in self._place.items() if self._done[n] != e - b]
        if missing:
            self.abort()
            raise SafetensorsError(f"{self.path}: tensors left incomplete: {missing[:5]}")
        self._f.flush()
        self._f.close()

    def abort(self) -> None:
        """Close without checks (the caller removes the file)."""
        try:
            self._f.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save_file(tensors: Mapping[str, np.ndarray], path, metadata: Mapping[str, str] | None = None) -> None:
    """Write NumPy arrays (float8/bfloat16 from ml_dtypes included) to one file."""
    specs = [TensorSpec(name, dtype_name(a.dtype), tuple(a.shape)) for name, a in tensors.items()]
    with SafetensorsWriter(path, specs, metadata) as w:
        for name, a in tensors.items():
            w.write(name, np.asarray(a))
