"""The microscaling kernels against the NumPy backend, bit for bit: every build (input type,
format, rounding, aligned or not, NVFP4's tensor amax in one launch), both scale layouts
with their padding, ragged shapes, odd NVFP4 rows in the dequantizer, device global amaxes,
torch and JAX arrays, and a tensor above 2**31 elements."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_same_bits
import op_table
from cuquant._core.dtypes import FLOATS
from cuquant.zero_point import random_bits

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
DTYPES = ("float32", "bfloat16", "float16")
SHAPES = ((1, 32), (3, 96), (127, 160), (129, 64), (300, 7168 // 4), (64, 7168), (1000, 32))
NV_SHAPES = ((1, 16), (5, 48), (129, 80), (300, 1776), (33, 7168))


def _dev(a):
    import cupy as cp

    if isinstance(a, np.ndarray) and a.dtype in (np.dtype(ml_dtypes.float8_e4m3fn),
                                                  np.dtype(ml_dtypes.float8_e8m0fnu)):
        a = a.view(np.uint8)
    return cp.asarray(a) if isinstance(a, np.ndarray) else a


def _same(dev, host, what):
    dev = dev if isinstance(dev, tuple) else (dev,)
    host = host if isinstance(host, tuple) else (host,)
    assert len(dev) == len(host), what
    for i, (d, h) in enumerate(zip(dev, host)):
        assert_same_bits(d, h, f"{what} output {i}")


def _x(rng, shape, dtype, edges=True):
    x = op_table.float_input(np, rng, shape, dtype)
    if edges and shape[0] >= 8:
        x[1] = 0
        x[2, 3] = np.nan
        x[3, 1] = np.inf
        x[4, : shape[1] // 2] = -0.0
        x[5] = (rng.standard_normal(shape[1]) * {"float16": 1e-6}.get(dtype, 1e-39)).astype(x.dtype)
        x[6, 0] = -np.inf
    return x


def _misaligned(x):
    """x's values in a CuPy array that starts 2 or 4 bytes past a 16-byte boundary."""
    import cupy as cp

    n = x.size
    buf = cp.empty(n + 8, dtype=x.dtype)
    off = 1 if x.itemsize == 4 else 2
    view = buf[off:off + n].reshape(x.shape)
    view[...] = cp.asarray(x)
    assert view.data.ptr % 16
    return view


ROUNDINGS = (("nearest", None), ("stochastic", "rbits"), ("stochastic", "seed"))


def _words(rng, shape, source, misaligned=False):
    if source == "rbits":
        r = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
        return {"rbits": _misaligned(r) if misaligned else _dev(r)}, {"rbits": r}
    if source == "seed":
        s = {"seed": int(rng.integers(0, 1 << 63))}
        return s, s
    return {}, {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_mx_quantizers(dtype, misaligned, rng):
    for shape in SHAPES:
        x = _x(rng, shape, dtype)
        xd = _misaligned(x) if misaligned else _dev(x)
        for mode, layout in itertools.product(("rceil", "floor"), ("row", "swizzled")):
            what = f"mxfp8 {shape} {dtype} {mode} {layout} misaligned={misaligned}"
            _same(cq.quantize_mxfp8(xd, mode, layout), cq.quantize_mxfp8(x, mode, layout), what)
            for rounding, source in ROUNDINGS:
                kd, kh = _words(rng, shape, source, misaligned)
                what = f"mxfp4 {shape} {dtype} {mode} {layout} {rounding} {source} {misaligned}"
                _same(cq.quantize_mxfp4(xd, mode, layout, rounding, **kd),
                      cq.quantize_mxfp4(x, mode, layout, rounding, **kh), what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_nvfp4_quantizer(dtype, misaligned, rng):
    import cupy as cp

    for shape in NV_SHAPES:
        for edges in (False, True):   # with edges, the tensor amax is NaN
            x = _x(rng, shape, dtype, edges)
            xd = _misaligned(x) if misaligned else _dev(x)
            for layout, (rounding, source) in itertools.product(("row", "swizzled"), ROUNDINGS):
                kd, kh = _words(rng, shape, source, misaligned)
                what = f"nvfp4 {shape} {dtype} {layout} {rounding} {source} {misaligned} {edges}"
                _same(cq.quantize_nvfp4(xd, None, layout, rounding, **kd),
                      cq.quantize_nvfp4(x, None, layout, rounding, **kh), what)
                _same(cq.quantize_nvfp4(xd, 2.5, layout, rounding, **kd),
                      cq.quantize_nvfp4(x, 2.5, layout, rounding, **kh), what + " static")
                ga = cp.asarray([np.float32(7.25)])
                got = cq.quantize_nvfp4(xd, ga, layout, rounding, **kd)
                assert got[2] is not None and float(got[2][0]) == 7.25
                _same(got[:2], cq.quantize_nvfp4(x, 7.25, layout, rounding, **kh)[:2],
                      what + " device amax")


def test_nvfp4_tensor_amax_over_the_whole_grid(rng):
    """The amax pass of one launch: large tensors (every block of the co-resident grid takes
    several tiles), the largest element in the last tile, the first, and repeated calls
    (the workspace is left zeroed for the next)."""
    for shape in ((4096, 7168), (3000, 1040), (1, 16)):
        x = op_table.float_input(np, rng, shape, "bfloat16")
        for where in (0, x.size - 1, (x.size // 2 + 17) % x.size):
            y = x.copy()
            y.reshape(-1)[where] = 5000.0
            for _ in range(2):
                _same(cq.quantize_nvfp4(_dev(y)), cq.quantize_nvfp4(y), f"{shape} max at {where}")


def test_swizzled_padding_is_written(rng):
    """Padding bytes are written by the kernel, not left from earlier allocations."""
    import cupy as cp

    junk = cp.full(1 << 20, 0xAB, dtype=cp.uint8)
    del junk   # the pool hands this memory out again
    x = op_table.float_input(np, rng, (130, 160), "bfloat16")
    for fn in (cq.quantize_mxfp8, cq.quantize_mxfp4):
        _same(fn(_dev(x), scale_layout="swizzled"), fn(x, scale_layout="swizzled"), fn.__name__)
    _same(cq.quantize_nvfp4(_dev(x), scale_layout="swizzled"),
          cq.quantize_nvfp4(x, scale_layout="swizzled"), "nvfp4")


VIEWS = {"column slice": lambda a: a[:, 32:288], "row stride": lambda a: a[::2],
         "column stride": lambda a: a[:, ::2]}


@pytest.mark.parametrize("view", list(VIEWS))
def test_non_contiguous_inputs(view, rng):
    import cupy as cp

    base = (rng.standard_normal((300, 512)) * 4).astype(np.float16)
    pick = VIEWS[view]
    for fn in (cq.quantize_mxfp8, cq.quantize_mxfp4, cq.quantize_nvfp4):
        for layout in ("row", "swizzled"):
            _same(fn(pick(cp.asarray(base)), scale_layout=layout), fn(pick(base), scale_layout=layout),
                  f"{fn.__name__} {view} {layout}")
    q, s = cq.quantize_mxfp8(base)     # every other row of codes and scales
    _same(cq.dequantize_mxfp8(_dev(q)[::2], _dev(s)[::2], "float32"),
          cq.dequantize_mxfp8(q[::2], s[::2], "float32"), "strided codes and scales")


@pytest.mark.parametrize("out", DTYPES)
def test_dequantizers(out, rng):
    """Every dequantizer build, both layouts, aligned and misaligned codes, NVFP4 rows of an
    odd number of blocks (a last unit of 8 bytes), NaN and zero scales."""
    for shape in SHAPES + NV_SHAPES:
        m, k = shape
        x = _x(rng, shape, "float32")
        for layout in ("row", "swizzled"):
            if k % 32 == 0:
                for quant, deq in ((cq.quantize_mxfp8, cq.dequantize_mxfp8),
                                   (cq.quantize_mxfp4, cq.dequantize_mxfp4)):
                    q, s = quant(x, scale_layout=layout)
                    want = deq(q, s, out)
                    _same(deq(_dev(q), _dev(s), out), want, f"{deq.__name__} {shape} {layout}")
                    _same(deq(_misaligned(q.view(np.uint8)), _dev(s), out), want,
                          f"{deq.__name__} {shape} {layout} misaligned")
            q, s, a = cq.quantize_nvfp4(x, 3.0, layout)
            want = cq.dequantize_nvfp4(q, s, a, out)
            _same(cq.dequantize_nvfp4(_dev(q), _dev(s), _dev(a), out), want, f"nvfp4 {shape}")
            _same(cq.dequantize_nvfp4(_misaligned(q), _dev(s), float(a[0]), out), want,
                  f"nvfp4 {shape} misaligned")
            for amax in (0.0, np.inf, np.nan, 1e-40):   # S_enc 1, 0, NaN, FLT_MAX
                a2 = np.array([amax], np.float32)
                _same(cq.dequantize_nvfp4(_dev(q), _dev(s), _dev(a2), out),
                      cq.dequantize_nvfp4(q, s, a2, out), f"nvfp4 {shape} amax {amax}")


def test_every_scale_byte_and_code(rng):
    """Every E8M0 byte with every e4m3 code, every e4m3 scale with every e2m1 code."""
    codes = np.arange(256, dtype=np.uint8)
    q = np.tile(codes, (256, 1))                       # [256, 256]: row r has scale byte r
    s = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 32, axis=1)
    for out in DTYPES:
        _same(cq.dequantize_mxfp8(_dev(q), _dev(s[:, :8]), out),
              cq.dequantize_mxfp8(q, s[:, :8], out), out)
        _same(cq.dequantize_mxfp4(_dev(q), _dev(s[:, :16]), out),
              cq.dequantize_mxfp4(q, s[:, :16], out), out)
        for amax in (2688.0, 1.0, 1e30):
            _same(cq.dequantize_nvfp4(_dev(q), _dev(s[:, :32]), amax, out),
                  cq.dequantize_nvfp4(q, s[:, :32], amax, out), f"{out} {amax}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_quotients_at_every_e2m1_boundary(dtype, rng):
    """Quotients at the e2m1 grid's midpoints and one unit of x's dtype either side, under
    block scales 2**j (row r: amax 6 * 2**j): the float16-pair encoder of 16-bit MX inputs
    and the float32 one, nearest and stochastic."""
    t = np.dtype(FLOATS[dtype].numpy)
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[t.itemsize]
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 6.0], np.float32)
    base = mids.astype(t)
    up = (base.view(bits) + 1).view(t)
    down = (base.view(bits) - 1).view(t)
    vals = np.concatenate([base, up, down]).astype(np.float32)        # 30 values
    js = np.arange(-12, 13) if dtype == "float16" else np.arange(-40, 41)
    x = np.zeros((len(js), 32), np.float32)
    for r, j in enumerate(js):
        x[r, 0] = 6.0 * 2.0 ** j
        x[r, 1:31] = vals * 2.0 ** j * rng.choice([-1, 1], size=30)
        x[r, 31] = rng.uniform(-6, 6) * 2.0 ** j
    x = x.astype(t)
    r = rng.integers(0, 1 << 32, size=x.shape, dtype=np.uint32)
    for rounding, kw in (("nearest", {}), ("stochastic", {"rbits": r})):
        kd = {k: _dev(v) for k, v in kw.items()}
        for mode in ("rceil", "floor"):
            _same(cq.quantize_mxfp4(_dev(x), mode, rounding=rounding, **kd),
                  cq.quantize_mxfp4(x, mode, rounding=rounding, **kw), f"{dtype} {mode} {rounding}")
        _same(cq.quantize_nvfp4(_dev(x), 2688.0, rounding=rounding, **kd),
              cq.quantize_nvfp4(x, 2688.0, rounding=rounding, **kw), f"{dtype} nvfp4 {rounding}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_stochastic_words_at_each_quotients_threshold(dtype, rng):
    """Random words one below, at and one above each quotient's threshold (up iff r24 is
    below the quotient's fraction of its grid step times 2**24), their low bytes 0x00 or
    0xff: quotients in every stretch of the e2m1 grid, at 6 (and above, under "floor"), and
    below 2**-25, where the fraction is not a whole number, down to float32's subnormals.
    Rows of one block whose amax (6, or 6.5 under "floor") makes MXFP4's multiplier 1, so
    that the quotients are x."""
    t = np.dtype(FLOATS[dtype].numpy)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
    picks = [0.3, 0.5, 0.7, 0.75, 1.1, 1.25, 1.9, 2.2, 2.5, 3.7, 4.5, 5.9, 6.0, 0.125,
             1.5 * 2.0 ** -20, 2.0 ** -24, 1.25 * 2.0 ** -26, 2.0 ** -40, 2.0 ** -100, 2.0 ** -126,
             1.5 * 2.0 ** -130, 2.0 ** -140, 0.0, 1e-3, 0.2, 0.45, 3.1, 5.1, 0.9, 1.6, 0.05]
    for mode, top in (("rceil", 6.0), ("floor", 6.5)):
        row = np.array([top] + picks, np.float32).astype(t)   # 32: one MX block
        v = np.abs(row[1:].astype(np.float64))
        lo_i = np.clip(np.searchsorted(grid, v, side="right") - 1, 0, 6)
        frac = np.where(v >= 6, 0.0, (v - grid[lo_i]) / (grid[lo_i + 1] - grid[lo_i]))
        threshold = np.floor(frac * 2.0 ** 24).astype(np.int64)
        x = np.tile(row, (6, 1))
        x[::2, 1:] = -x[::2, 1:]   # signs, -0 among them
        r = rng.integers(0, 1 << 32, size=x.shape, dtype=np.uint32)
        for k, (shift, low) in enumerate(itertools.product((-1, 0, 1), (0x00, 0xFF))):
            r24 = np.clip(threshold + shift, 0, (1 << 24) - 1).astype(np.uint32)
            r[k, 1:] = (r24 << np.uint32(8)) | np.uint32(low)
        scales = cq.quantize_mxfp4(x, mode, rounding="stochastic", rbits=r)[1]
        assert (scales.view(np.uint8) == 127).all()   # the multiplier is 1
        _same(cq.quantize_mxfp4(_dev(x), mode, rounding="stochastic", rbits=_dev(r)),
              cq.quantize_mxfp4(x, mode, rounding="stochastic", rbits=r), f"{dtype} mxfp4 {mode}")
        for amax in (None, 6.0, 1e-30):
            _same(cq.quantize_nvfp4(_dev(x), amax, rounding="stochastic", rbits=_dev(r))[:2],
                  cq.quantize_nvfp4(x, amax, rounding="stochastic", rbits=r)[:2],
                  f"{dtype} nvfp4 {amax} {mode} rows")


def test_seed_is_the_words_of_random_bits(rng):
    x = op_table.float_input(np, rng, (37, 4096), "bfloat16")
    for fn in (cq.quantize_mxfp4, cq.quantize_nvfp4):
        _same(fn(_dev(x), rounding="stochastic", seed=99),
              fn(_dev(x), rounding="stochastic", rbits=_dev(random_bits(x.shape, 99))),
              fn.__name__)


def test_torch_and_jax_on_the_gpu(rng):
    torch = pytest.importorskip("torch")
    x = op_table.float_input(np, rng, (64, 256), "bfloat16")
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()
    q, s = cq.quantize_mxfp8(xt)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu and q.is_cuda
    _same((q.view(torch.uint8).cpu().numpy(), s.view(torch.uint8).cpu().numpy()),
          tuple(np.asarray(a).view(np.uint8) for a in cq.quantize_mxfp8(x)), "torch mxfp8")
    back = cq.dequantize_mxfp8(q, s, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and back.is_cuda
    p, sn, a = cq.quantize_nvfp4(xt)
    assert p.dtype == torch.uint8 and sn.dtype == torch.float8_e4m3fn and a.is_cuda
    y = cq.dequantize_nvfp4(p.view(torch.float4_e2m1fn_x2), sn, a, torch.float32)
    assert_same_bits(y.cpu().numpy(), cq.dequantize_nvfp4(*cq.quantize_nvfp4(x), "float32"))
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        return
    jnp = jax.numpy
    xj = jax.device_put(jnp.asarray(x), jax.devices("gpu")[0])
    qj, sj = cq.quantize_mxfp4(xj)
    assert sj.dtype == jnp.float8_e8m0fnu
    assert_same_bits(np.asarray(sj).view(np.uint8),
                     np.asarray(cq.quantize_mxfp4(x)[1]).view(np.uint8), "jax e8m0")


def test_above_2_31_elements(rng):
    """One tensor above 2**31 elements (64-bit offsets), NVFP4 with its tensor amax, and
    MXFP8, checked on rows either side of the 2**31 boundary; skipped without 24 GB free."""
    import cupy as cp

    free, _ = cp.cuda.runtime.memGetInfo()
    if free < 24 << 30:
        pytest.skip("needs 24 GB of free device memory")
    rows, k = (1 << 31) // 4096 + 16, 4096
    g = cp.random.default_rng(int(rng.integers(1 << 31)))
    x32 = g.standard_normal((rows, k), dtype=cp.float32)
    x32[rows - 1, k - 1] = 4000.0        # the tensor amax in the last element
    x = x32.astype(BF16)
    del x32
    boundary = (1 << 31) // k
    check = np.r_[0:2, boundary - 2:boundary + 2, rows - 2:rows]
    xh = x[check].get()
    q, s, a = cq.quantize_nvfp4(x, scale_layout="swizzled")
    assert float(a[0]) == 4000.0
    qh, sh, _ = cq.quantize_nvfp4(xh, 4000.0)
    assert_same_bits(q[check], qh, "nvfp4 codes")
    s_rows = cq.dequantize_nvfp4(q, s, a, BF16)[check]
    assert_same_bits(s_rows, cq.dequantize_nvfp4(qh, sh, a.get(), BF16), "nvfp4 round trip")
    del q, s, s_rows
    q, s = cq.quantize_mxfp8(x)
    qh, sh = cq.quantize_mxfp8(xh)
    assert_same_bits(q[check], np.asarray(qh).view(np.uint8), "mxfp8 codes")
    assert_same_bits(s[check], np.asarray(sh).view(np.uint8), "mxfp8 scales")
