"""The checkpoint command's reading ahead and writing behind: the bytes are those of the
plain reads and writes whatever order the work asks in, and a failed write reaches the
caller."""

from __future__ import annotations

import numpy as np
import pytest

from cuquant.checkpoint.read import open_checkpoint
from cuquant.checkpoint.safetensors import (
    load_file,
    save_file,
    SafetensorsError,
    SafetensorsWriter,
    TensorSpec,
)
from cuquant.checkpoint.write import _ReadAhead, _WriteBehind


@pytest.fixture
def two_tensors(tmp_path, rng):
    data = {"a": rng.standard_normal((64, 48)).astype(np.float32),
            "b": rng.integers(0, 255, (10, 7), dtype=np.uint8)}
    save_file(data, tmp_path / "x.safetensors")
    return tmp_path / "x.safetensors", data


def test_read_ahead_hands_over_planned_reads_and_makes_unplanned_ones(two_tensors):
    path, data = two_tensors
    planned = [("rows", "a", 0, 16), ("rows", "a", 16, 64), ("bytes", "b", 0, 70)]
    with open_checkpoint(path) as ck:
        ahead = _ReadAhead(ck, planned, np.empty, depth=2)
        try:
            f = ahead.file_of("a")
            np.testing.assert_array_equal(f.read_rows("a", 0, 16), data["a"][:16])
            # out of plan: read here, the plan's later reads still line up
            np.testing.assert_array_equal(f.read_rows("a", 3, 5), data["a"][3:5])
            np.testing.assert_array_equal(f.read_rows("a", 16, 64), data["a"][16:])
            assert ahead.file_of("b").read_bytes("b", 0, 70) == data["b"].tobytes()
            assert ahead.tensors is ck.tensors
        finally:
            ahead.close()


def test_read_ahead_reads_rows_into_the_given_memory(two_tensors):
    path, data = two_tensors
    given = []

    def alloc(shape, dtype):
        given.append(np.full(shape, -1, dtype))
        return given[-1]

    with open_checkpoint(path) as ck:
        ahead = _ReadAhead(ck, [("rows", "a", 8, 24)], alloc)
        try:
            got = ahead.file_of("a").read_rows("a", 8, 24)
        finally:
            ahead.close()
    assert got is given[0]
    np.testing.assert_array_equal(got, data["a"][8:24])


def test_write_behind_writes_in_order(tmp_path, rng):
    x = rng.standard_normal((40, 9)).astype(np.float32)
    with SafetensorsWriter(tmp_path / "y.safetensors", [TensorSpec("x", "F32", x.shape)]) as w0:
        w = _WriteBehind(w0, depth=1)
        for r0 in range(0, 40, 3):
            w.write("x", x[r0:r0 + 3].copy())
        w.drain()
    np.testing.assert_array_equal(load_file(tmp_path / "y.safetensors")["x"], x)


def test_write_behind_raises_a_failed_write(tmp_path):
    w0 = SafetensorsWriter(tmp_path / "z.safetensors", [TensorSpec("x", "U8", (4,))])
    w = _WriteBehind(w0)
    w.write("x", np.zeros(8, np.uint8))  # twice the tensor's bytes
    with pytest.raises(SafetensorsError, match="more than its 4"):
        w.drain()
    w0.abort()


def test_reads_on_several_threads_of_one_file(tmp_path, rng):
    x = rng.standard_normal((4096, 64)).astype(np.float32)
    save_file({"x": x}, tmp_path / "big.safetensors")
    planned = [("rows", "x", r, r + 16) for r in range(0, 4096, 16)]
    with open_checkpoint(tmp_path / "big.safetensors") as ck:
        ahead = _ReadAhead(ck, planned, np.empty, depth=32, threads=8)
        try:
            f = ahead.file_of("x")
            for _, _, r0, r1 in planned:
                np.testing.assert_array_equal(f.read_rows("x", r0, r1), x[r0:r1])
        finally:
            ahead.close()
