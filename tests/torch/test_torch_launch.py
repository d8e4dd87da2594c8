"""The torch side of the GPU backend that runs without a GPU: outputs made by torch from an
`Outputs` layout (shapes, dtypes, fp8 as float8_e4m3fn tensors, their addresses), here on a
CPU device in place of the call's CUDA one, and the cache of torch streams by handle."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from cuquant._cuda import launch as _gpu  # noqa: E402


def _on_cpu(stream):
    stream.torch_device = torch.device("cpu")
    return stream


@pytest.mark.parametrize("specs", [
    (((3, 64), ml_dtypes.float8_e4m3fn),),
    (((16, 128), np.int8), ((16, 1), np.float32)),
    (((2, 8), ml_dtypes.bfloat16), ((2, 4), np.float16), ((5,), np.uint8)),
])
def test_torch_outputs_are_the_layouts_tensors(specs):
    outputs = _gpu.Outputs(*specs)
    arrays, ptrs = outputs.make(_on_cpu(_gpu.TorchStream(0, 12345)))
    want = [(shape, str(np.dtype(dt))) for shape, dt in specs]
    assert [(tuple(a.shape), str(a.dtype).removeprefix("torch.")) for a in arrays] == want
    assert all(a.is_contiguous() for a in arrays)
    assert list(ptrs) == [a.data_ptr() for a in arrays]
    again, ptrs2 = outputs.make(_on_cpu(_gpu.TorchStream(0, 12345)))
    assert set(ptrs2).isdisjoint(ptrs)  # new tensors each call (the first still held)


def test_torch_streams_are_kept_by_handle_and_device():
    _gpu._torch_streams.clear()
    a = _gpu.torch_stream(0, 777)
    assert _gpu.torch_stream(0, 777) is a
    b = _gpu.torch_stream(1, 777)  # the same handle number on another device
    assert b is not a and (b.device, b.ptr) == (1, 777)
    assert _gpu.torch_stream(0, 778).ptr == 778
    for i in range(_gpu.PLAN_LIMIT + 1):
        _gpu.torch_stream(0, 10_000 + i)
    assert len(_gpu._torch_streams) <= _gpu.PLAN_LIMIT
    _gpu._torch_streams.clear()
