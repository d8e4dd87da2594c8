"""Repeated calls on CuPy arrays run a replay of the first call (cuquant/_core/replay.py).

Two kinds of test, neither needing a GPU:

- the mechanism, on a stand-in array type: what enters a key, when a replay is kept, and
  that anything a key cannot describe goes the whole way;
- every declared op on real CuPy arrays over memory that is never touched, with the
  allocator, device queries and launches replaced by recorders: the replay must launch
  exactly what the first call launched, with the new input's address.

The GPU tests (test_gpu.py, test_groupwise_gpu.py) repeat calls with the same shapes on
fresh data, so there the replays' codes are compared with the NumPy backend bit for bit.
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest

from cuquant._core import replay as _fast


# ---------------------------------------------------------------------------------------
# The mechanism, on a stand-in array type

class Mem:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


class FakeArray:
    def __init__(self, shape, dtype=np.float16, ptr=4096, contiguous=True, device=0):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.data = Mem(ptr, device)
        self._c_contiguous = contiguous


@pytest.fixture
def fake(monkeypatch):
    """_fast on FakeArray, device 0 current, an op that records how it was reached."""
    monkeypatch.setattr(_fast, "ND", FakeArray)
    monkeypatch.setattr(_fast, "_device", lambda: 0)
    monkeypatch.setattr(_fast, "_stream", lambda: "stream")
    monkeypatch.setattr(_fast, "_table", {})
    seen = {"whole": 0, "replays": []}

    def op(x, *args, stream=None, group_size=128, offers=1, fail=False):
        seen["whole"] += 1
        if fail:
            raise ValueError("refused")
        for _ in range(offers):
            _fast.offer(lambda s, ptrs: seen["replays"].append((s, tuple(ptrs))) or "replayed")
        return "whole"

    seen["op"] = _fast.replayable(op)
    return seen


def test_second_call_replays_with_new_addresses(fake):
    op = fake["op"]
    assert op(FakeArray((4, 8), ptr=4096)) == "whole"
    assert op(FakeArray((4, 8), ptr=8192)) == "replayed"
    assert op(FakeArray((4, 8), ptr=8192), FakeArray((8,), np.float32, ptr=65536)) == "whole"
    assert op(FakeArray((4, 8), ptr=16), FakeArray((8,), np.float32, ptr=32)) == "replayed"
    assert fake["whole"] == 2
    assert fake["replays"] == [("stream", (8192,)), ("stream", (16, 32))]


@pytest.mark.parametrize("first, second", [
    (dict(group_size=1), dict(group_size=True)),
    (dict(group_size=128), dict(group_size=128.0)),
    (dict(group_size=128), dict(group_size=64)),
])
def test_arguments_of_other_types_or_values_do_not_share_a_key(fake, first, second):
    op = fake["op"]
    op(FakeArray((4, 8)), **first)
    assert op(FakeArray((4, 8)), **first) == "replayed"
    assert op(FakeArray((4, 8)), **second) == "whole"


@pytest.mark.parametrize("other", [
    dict(shape=(4, 9)),
    dict(dtype=np.float32),
    dict(ptr=4096 + 2),     # another alignment: another plan
])
def test_arrays_that_differ_do_not_share_a_key(fake, other):
    op = fake["op"]
    op(FakeArray((4, 8)))
    kw = dict(shape=(4, 8), dtype=np.float16, ptr=4096)
    kw.update(other)
    assert op(FakeArray(kw.pop("shape"), **kw)) == "whole"


@pytest.mark.parametrize("call", [
    lambda op: op(FakeArray((4, 8), contiguous=False)),
    lambda op: op(FakeArray((4, 8)), FakeArray((8,), contiguous=False)),
    lambda op: op(FakeArray((4, 8)), FakeArray((8,), device=1)),
    lambda op: op(FakeArray((4, 8)), [1, 2]),
    lambda op: op(FakeArray((4, 8)), np.int64(3)),
    lambda op: op(FakeArray((4, 8)), group_size=FakeArray((1,), contiguous=False)),
    lambda op: op(FakeArray((4, 8)), group_size=FakeArray((1,), device=1)),
    lambda op: op(FakeArray((4, 8)), stream="other"),
    lambda op: op(np.zeros((4, 8))),
])
def test_what_a_key_cannot_describe_goes_the_whole_way(fake, call):
    op = fake["op"]
    for _ in range(3):
        assert call(op) == "whole"
    assert fake["replays"] == [] and fake["whole"] == 3


def _named_op(seen):
    """An op with two array arguments that may be given by name and a seed handed to the
    replay; its replays record their addresses and values."""

    def op(x, scale=None, zeros=None, seed=None, *, stream=None):
        seen["whole"] += 1
        if seed is not None and not 0 <= seed < 1 << 64:
            raise ValueError("seed out of range")
        _fast.offer(lambda s, ptrs, seed=seed: seen["replays"].append((tuple(ptrs), seed))
                    or "replayed")
        return "whole"

    return _fast.replayable(op, values={"seed": lambda v: 0 <= v < 1 << 64})


def test_arrays_given_by_name_replay_with_their_addresses_in_the_ops_order(fake):
    op = _named_op(fake)
    x, s, z = (FakeArray((4, 8), ptr=4096), FakeArray((4,), np.float32, ptr=8192),
               FakeArray((4,), np.float32, ptr=12288))
    assert op(x, scale=s, zeros=z) == "whole"
    x2, s2, z2 = (FakeArray((4, 8), ptr=1 << 20), FakeArray((4,), np.float32, ptr=2 << 20),
                  FakeArray((4,), np.float32, ptr=3 << 20))
    assert op(x2, scale=s2, zeros=z2) == "replayed"
    assert op(x2, s2, zeros=z2) == "whole"  # by position: another key, the same addresses
    assert op(x2, s2, zeros=z2) == "replayed"
    assert fake["replays"] == [((1 << 20, 2 << 20, 3 << 20), None)] * 2
    # Named arrays out of the op's order would hand the replay its addresses out of order.
    for _ in range(2):
        assert op(x2, zeros=z2, scale=s2) == "whole"
    assert len(fake["replays"]) == 2


def test_a_seed_reaches_the_replay_as_a_value(fake):
    op = _named_op(fake)
    x = FakeArray((4, 8))
    assert op(x, seed=7) == "whole"
    assert op(x, seed=2**64 - 1) == "replayed"
    assert op(x, seed=0) == "replayed"
    assert fake["replays"] == [((4096,), 2**64 - 1), ((4096,), 0)]
    with pytest.raises(ValueError):  # refused by the op itself, not replayed
        op(x, seed=2**64)
    with pytest.raises(ValueError):
        op(x, seed=-1)
    assert fake["whole"] == 3 and len(fake["replays"]) == 2
    # A seed given by position is part of the key, value and all.
    assert op(x, None, None, 5) == "whole"
    assert op(x, None, None, 6) == "whole"
    assert op(x, None, None, 6) == "replayed"
    assert fake["replays"][-1] == ((4096,), 6)  # the replay's own seed


def test_torch_dtypes_are_plain_once_torch_is_met(fake):
    torch = pytest.importorskip("torch")
    _fast.enable_torch(torch)
    op = fake["op"]
    op(FakeArray((4, 8)), torch.bfloat16)
    assert op(FakeArray((4, 8)), torch.bfloat16) == "replayed"
    assert op(FakeArray((4, 8)), torch.float16) == "whole"


def test_another_current_device_goes_the_whole_way(fake, monkeypatch):
    op = fake["op"]
    op(FakeArray((4, 8)))
    monkeypatch.setattr(_fast, "_device", lambda: 1)
    assert op(FakeArray((4, 8))) == "whole"


@pytest.mark.parametrize("kw", [dict(fail=True), dict(offers=0), dict(offers=2)])
def test_only_a_call_that_succeeded_with_one_launch_is_kept(fake, kw):
    op = fake["op"]
    for _ in range(3):
        try:
            op(FakeArray((4, 8)), **kw)
        except ValueError:
            pass
    assert fake["whole"] == 3 and _fast._table == {}


def test_a_call_inside_another_spoils_the_outer_one(fake):
    inner = fake["op"]

    def outer_op(x, *, stream=None):
        _fast.offer(lambda s, ptrs: "outer replayed")
        inner(FakeArray((2, 2), ptr=1 << 20))
        return "outer"

    outer = _fast.replayable(outer_op)
    assert outer(FakeArray((4, 8))) == "outer"
    assert outer(FakeArray((4, 8))) == "outer"   # not kept: it held a second call
    assert inner(FakeArray((2, 2), ptr=1 << 21)) == "replayed"  # the inner call was kept


def test_the_table_stays_bounded(fake, monkeypatch):
    monkeypatch.setattr(_fast, "PLAN_LIMIT", 8)
    op = fake["op"]
    for n in range(1, 30):
        op(FakeArray((n, 8)))
    assert 0 < len(_fast._table) <= 8


# ---------------------------------------------------------------------------------------
# Every declared op: the replay launches what the first call launched

cp = pytest.importorskip("cupy")

import op_table  # noqa: E402
from _util import op_variant_cases  # noqa: E402
from cuquant import groupwise  # noqa: E402
from cuquant._core import arrays as _arrays  # noqa: E402
from cuquant._cuda import kernels as _kernels  # noqa: E402
from cuquant._cuda import groupwise as _gpu_groupwise  # noqa: E402
from cuquant._cuda import launch as _gpu  # noqa: E402

BASE = 0x7F0000000000  # device memory that is never touched: nothing is launched


class Kernel:
    """What _kernels.function returns here: the expression instead of a compiled kernel."""

    max_dynamic_shared_size_bytes = 48 * 1024

    def __init__(self, expr):
        self.expr = expr
        self.kernel = self  # Launch reads fn.kernel.ptr
        self.ptr = hash(expr)


@pytest.fixture
def recorded(monkeypatch):
    """CuPy arrays over untouched memory; every allocation returns the same block, so two
    calls' outputs have the same addresses; launches are recorded, not made."""
    assert _arrays.cupy_module() is not None  # CuPy imported: _fast is enabled
    mem = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(BASE, 1 << 34, None, device_id=0), 0)
    launches = []
    stream = cp.cuda.Stream.null

    def record(self, grid, threads, stream_, args):
        launches.append((self.fn.expr, grid, threads, self.smem, tuple(args)))

    previous = cp.cuda.get_allocator()
    cp.cuda.set_allocator(lambda n: mem)
    _gpu.clear_plans()
    monkeypatch.setattr(_fast, "ND", cp.ndarray)
    monkeypatch.setattr(_fast, "_device", lambda: 0)
    monkeypatch.setattr(_fast, "_stream", lambda: stream)
    monkeypatch.setattr(_gpu, "_get_device", lambda: 0)
    monkeypatch.setattr(_gpu, "_current_stream", lambda: stream)
    monkeypatch.setattr(_kernels, "function", lambda src, expr, device: Kernel(expr))
    monkeypatch.setattr(_gpu, "resident_blocks", lambda *a, **k: 4 * 132)
    monkeypatch.setattr(_gpu, "props", lambda d: {"sm_count": 132, "cc": "90",
                                                  "smem_optin": 227 * 1024})
    workspace = cp.ndarray((4,), np.uint32, mem + (1 << 33))
    monkeypatch.setattr(_gpu, "workspace", lambda *a: workspace.data.ptr)
    monkeypatch.setattr(_gpu.Launch, "__call__", record)
    try:
        yield mem, launches
    finally:
        cp.cuda.set_allocator(previous)
        _gpu.clear_plans()  # plans of stand-in kernels


def _on_device(mem, args, kwargs, offset):
    """The NumPy arrays among the arguments as CuPy arrays of the same shapes and dtypes
    (fp8 codes as uint8, as CuPy holds them), one after another from mem + offset."""
    at = offset

    def move(a):
        nonlocal at
        if not isinstance(a, np.ndarray):
            return a
        dt = np.dtype(np.uint8) if a.dtype.name == "float8_e4m3fn" else a.dtype
        moved = cp.ndarray(a.shape, dt, mem + at)
        at += -(-max(a.nbytes, 1) // 4096) * 4096 + 4096
        return moved

    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


CASES = op_variant_cases(op_table.all_ops(), skip=("dequantize_groupwise_batched",))


@pytest.mark.parametrize("op, variant", CASES)
def test_replay_launches_what_the_first_call_launched(recorded, op, variant, rng):
    """Two calls on inputs at other addresses (same alignment), and another seed for a
    seeded variant: the second runs the replay, and launches the same kernel, grid, block
    and shared memory with the same arguments but the inputs' addresses and the seed's
    words; its outputs have the shapes, dtypes, strides and (one allocator block here)
    addresses of the first call's."""
    mem, launches = recorded
    args, kwargs = op.make(np, rng, (16, 4096), op.dtypes[0], **variant)
    first_args, first_kw = _on_device(mem, args, kwargs, 1 << 30)
    second_args, second_kw = _on_device(mem, args, kwargs, 1 << 31)
    moved = {}
    if "seed" in kwargs:  # seeds whose 32-bit words stand out among the arguments
        first_kw["seed"], second_kw["seed"] = 0x0123456789ABCDEF, 0x0FEDCBA987654321
        moved = {0x89ABCDEF: 0x87654321, 0x01234567: 0x0FEDCBA9}
    first = op.fn(*first_args, **first_kw)
    second = op.fn(*second_args, **second_kw)
    assert len(_fast._table) == 1
    assert len(launches) == 2
    moved.update({a.data.ptr: b.data.ptr for a, b in zip(first_args + list(first_kw.values()),
                                                        second_args + list(second_kw.values()))
                  if isinstance(a, cp.ndarray)})
    assert launches[1][:4] == launches[0][:4]
    assert launches[1][4] == tuple(moved.get(v, v) for v in launches[0][4])
    first = first if isinstance(first, tuple) else (first,)
    second = second if isinstance(second, tuple) else (second,)
    assert [(o.shape, o.dtype, o.strides, o.data.ptr) for o in first] == \
        [(o.shape, o.dtype, o.strides, o.data.ptr) for o in second]


def _record_tables(monkeypatch, launches):
    """Launches of kernels with a struct argument recorded with the struct's words."""
    tables = []

    def record(self, grid, threads, stream_, data):
        launches.append((self.fn.expr, grid, threads, self.smem))
        tables.append(np.frombuffer(bytes(data), dtype=np.uint64).copy())

    monkeypatch.setattr(_gpu.Launch, "with_struct", record)
    monkeypatch.setattr(cp.cuda, "Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cp.cuda, "get_current_stream", lambda: cp.cuda.Stream.null)
    return tables


ITEMS = _gpu_groupwise.BATCH_ITEMS


def _rows(table):
    """The items of a BatchTable (8 words each) and their count."""
    n = int(table[8 * ITEMS]) & 0xffffffff
    return table[:8 * ITEMS].reshape(ITEMS, 8)[:n], n


def test_batched_replay_passes_the_table_the_first_call_passed(recorded, monkeypatch, rng):
    """A batch of CuPy items replayed: the same launch, and a table (the kernel's argument)
    whose rows differ from the first call's only by the items' new addresses; items given
    as dicts, or a params array that had to be copied to be aligned, are never kept."""
    mem, launches = recorded
    tables = _record_tables(monkeypatch, launches)
    from cuquant import dequantize_groupwise_batched

    host_items = op_table.groups.batched_inputs(np, rng, 6, 4096)
    first, second = ([tuple(_on_device(mem, it[:2], {}, at + 65536 * i)[0]) + tuple(it[2:])
                      for i, it in enumerate(host_items)] for at in (1 << 30, 1 << 31))
    out1 = dequantize_groupwise_batched(first, "float16")
    out2 = dequantize_groupwise_batched(second, "bfloat16")   # another key: the whole way
    out3 = dequantize_groupwise_batched(second, "float16")    # replayed
    assert len(_fast._table) == 2 and len(launches) == 3 and len(tables) == 3
    assert launches[2] == launches[0]
    rows0, n = _rows(tables[0])
    assert n == sum(1 for it in first if it[0].size)
    moved = {a.data.ptr: b.data.ptr for x, y in zip(first, second) for a, b in zip(x[:2], y[:2])}
    want = tables[0].copy()
    for row in want[:8 * ITEMS].reshape(ITEMS, 8)[:n]:
        row[0], row[1] = moved[int(row[0])], moved[int(row[1])]
    np.testing.assert_array_equal(tables[2], want)
    assert [(o.shape, o.dtype, o.data.ptr) for o in out1] == \
        [(o.shape, o.dtype, o.data.ptr) for o in out3]
    assert [o.dtype for o in out2] == [np.dtype(ml_dtypes.bfloat16)] * len(out2)
    n = len(_fast._table)
    dequantize_groupwise_batched([dict(zip(groupwise._ITEM_KEYS, it)) for it in second],
                                 "float16")
    odd = cp.ndarray(second[0][1].shape, np.float32, second[0][1].data + 4)  # 4 bytes off
    monkeypatch.setattr(cp.ndarray, "copy",  # the realignment copy, as a new array
                        lambda self: cp.ndarray(self.shape, self.dtype, self.data))
    dequantize_groupwise_batched([(second[0][0], odd) + second[0][2:]] + second[1:],
                                 "float16")
    assert len(_fast._table) == n


def test_a_batch_past_a_tables_items_takes_a_launch_a_table(recorded, monkeypatch, rng):
    """ITEMS + 7 tensors: two launches, the second table holding the last 7 items, each
    table's blocks numbered from 0 and its grid the sum of its items' blocks."""
    mem, launches = recorded
    tables = _record_tables(monkeypatch, launches)
    from cuquant import dequantize_groupwise_batched

    q = np.zeros((4, 256), np.int8)
    p = np.ones((8, 1), np.float32)
    items = [tuple(_on_device(mem, (q, p), {}, (1 << 30) + 8192 * i)[0]) + (8, True, 128)
             for i in range(ITEMS + 7)]
    dequantize_groupwise_batched(items, "float32")
    assert len(launches) == 2
    for (_, grid, _, _), table, count in zip(launches, tables, (ITEMS, 7)):
        rows, n = _rows(table)
        assert n == count
        starts = [int(r[5]) for r in rows]
        assert starts[0] == 0 and starts == sorted(starts)
        assert grid == starts[-1] + (starts[1] - starts[0])  # items of one size
    addresses = [int(r[0]) for t in tables for r in _rows(t)[0]]
    assert addresses == [it[0].data.ptr for it in items]


def test_given_outputs_are_taken_once_and_only_when_they_fit(recorded):
    """A call's output buffers given with the stream (XLA's, in a jax.jit call) become the
    outputs when they are what the call makes, once; otherwise the call allocates."""
    mem, _ = recorded
    fit = [(1 << 20, (4, 8), np.dtype(np.uint8)), (1 << 21, (4,), np.dtype(np.float32))]
    outputs = _gpu.Outputs(((4, 8), ml_dtypes.float8_e4m3fn), ((4,), np.float32))
    stream = _gpu.given_stream(1234, 0, fit)
    arrays, ptrs = outputs.make(stream)
    assert ptrs == (1 << 20, 1 << 21) and [a.data.ptr for a in arrays] == list(ptrs)
    assert [(a.shape, a.dtype) for a in arrays] == [((4, 8), np.uint8), ((4,), np.float32)]
    _, again = outputs.make(stream)  # taken already: allocated
    assert again[0] == mem.ptr
    for wrong in ([fit[0]], [fit[0], (1 << 21, (5,), np.dtype(np.float32))],
                  [fit[0], (1 << 21, (4,), np.dtype(np.float16))]):
        _, ptrs = outputs.make(_gpu.given_stream(1234, 0, wrong))
        assert ptrs[0] == mem.ptr
