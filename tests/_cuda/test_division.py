"""The symmetric quantizers divide a 16-bit value x by its group's scale b = RN(amax *
f32(1/qmax)) with one Newton correction instead of two (cuda_src/common/arith.cuh, divide_fast).
That is exact only for the dividends and divisors those kernels meet; these tests check it
for every one of them, with exact arithmetic emulated in float64.

Scaling x and amax by the same power of two scales b, RN(1/b), every product, remainder and
quotient exactly (the kernels prescale tiny scales so that all of them stay normal), so it
is enough to take amax in [1, 2): every significand of the input format for amax, every
significand for x, and every exponent gap d between them with x <= amax. Gaps beyond 24
give quotients below 448 * 2**-24, far under the smallest code step (2**-10), and the
int8 codes stop changing long before.
"""

from __future__ import annotations

import numpy as np
import pytest

F32, F64 = np.float32, np.float64
INV_QMAX = {127: F32(1) / F32(127), 448: F32(1) / F32(448)}
MAX_GAP = 24


def significands(bits: int) -> np.ndarray:
    """Every value in [1, 2) with `bits` significant bits (bf16: 8, fp16: 11)."""
    return 1.0 + np.arange(1 << (bits - 1), dtype=F64) / (1 << (bits - 1))


def _neighbours(t: np.ndarray):
    return np.nextafter(t, F32(np.inf)), np.nextafter(t, F32(-np.inf))


def rn32_quotient(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """RN32(x / b) for positive float32 x, b, exactly: the float64 quotient rounded again
    may land one ulp off, so the candidate is checked against its two midpoints (a
    midpoint times b is exact in float64, and a quotient is never a midpoint)."""
    x64, b64 = x.astype(F64), b.astype(F64)
    t = (x64 / b64).astype(F32)
    up, dn = _neighbours(t)
    m_up = (t.astype(F64) + up.astype(F64)) / 2
    m_dn = (t.astype(F64) + dn.astype(F64)) / 2
    assert not np.any(x64 == m_up * b64) and not np.any(x64 == m_dn * b64)
    t = np.where(x64 > m_up * b64, up, t)
    return np.where(x64 < m_dn * b64, dn, t)


def rn32_sum(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN32(a + c) for float64 a, c whose exact sum may not fit a float64: the rounded sum
    and its exact error (two-sum), the error breaking the tie when the rounded sum is a
    float32 midpoint."""
    s = a + c
    bb = s - a
    err = (a - (s - bb)) + (c - bb)
    t = s.astype(F32)
    t64 = t.astype(F64)
    up, dn = _neighbours(t)
    other = np.where(s > t64, up, dn)
    at_mid = s == (t64 + other.astype(F64)) / 2
    hi, lo = np.maximum(t, other), np.minimum(t, other)
    t = np.where(at_mid & (err > 0), hi, t)
    return np.where(at_mid & (err < 0), lo, t)


def divide(x: np.ndarray, b: np.ndarray, y: np.ndarray, corrections: int) -> np.ndarray:
    """The kernels' sequence: q = RN(x * y), then q = fma(fma(q, -b, x), y, q) per
    correction, each fma rounded once."""
    x64, b64, y64 = x.astype(F64), b.astype(F64), y.astype(F64)
    q = (x64 * y64).astype(F32)                         # <= 35 bits: exact, one rounding
    for _ in range(corrections):
        r = (x64 - q.astype(F64) * b64).astype(F32)     # <= 49 bits: exact, one rounding
        q = rn32_sum(q.astype(F64), r.astype(F64) * y64)
    return q


def mismatches(bits: int, qmax: int, corrections: int) -> int:
    """Cases where `corrections` corrections do not give the correctly rounded quotient."""
    amax = significands(bits)
    b = (amax * F64(INV_QMAX[qmax])).astype(F32)        # <= 35 bits: one rounding
    y = rn32_quotient(np.ones_like(b), b)
    sig = significands(bits)
    bad = 0
    for gap in range(MAX_GAP + 1):
        x = np.broadcast_to((sig * 2.0 ** -gap)[None, :], (amax.size, sig.size))
        keep = x <= amax[:, None]
        xs = x[keep].astype(F32)
        bs = np.broadcast_to(b[:, None], x.shape)[keep]
        ys = np.broadcast_to(y[:, None], x.shape)[keep]
        bad += int(np.count_nonzero(divide(xs, bs, ys, corrections) != rn32_quotient(xs, bs)))
    return bad


@pytest.mark.parametrize("qmax", [127, 448])
@pytest.mark.parametrize("fmt,bits", [("bfloat16", 8), ("float16", 11)])
def test_one_correction_is_exact_for_16_bit_values(fmt, bits, qmax):
    assert mismatches(bits, qmax, corrections=1) == 0


def test_the_check_sees_a_missing_correction():
    # Without the correction the product alone misses ties such as 1.15625 / RN(1.15625 /
    # 127) = 63.5 - 1 ulp, read as 63.5: the check must count those.
    assert mismatches(8, 127, corrections=0) > 0


def test_emulation_against_known_cases():
    # A hand case: amax = 1.15625 gives b = RN(amax / 127); x = amax / 2 has the exact
    # quotient 63.5 * (amax / 127) / b, just below 63.5 (the f32 just below it).
    b = (F64(1.15625) * F64(INV_QMAX[127])).astype(F32)
    x = np.array([0.578125], F32)
    bb = np.array([b], F32)
    y = rn32_quotient(np.ones(1, F32), bb)
    exact = rn32_quotient(x, bb)
    assert exact[0] == np.nextafter(F32(63.5), F32(0))
    assert divide(x, bb, y, 0)[0] == F32(63.5)
    assert divide(x, bb, y, 1)[0] == exact[0]


def test_power_of_two_scales_need_no_correction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100000).astype(F32)
    for e in (-20, -7, 0, 5):
        b = np.full_like(x, F32(2.0 ** e))
        y = rn32_quotient(np.ones_like(b), b)
        assert np.array_equal(divide(np.abs(x), b, y, 0), rn32_quotient(np.abs(x), b))


def test_two_corrections_from_the_reciprocal_are_exact():
    # SmoothQuant divides x by a per-column factor b from y = RN(1/b) with two corrections
    # (common.cuh, divide_by_reciprocal), relying on it for |x| >= 2**-100 and quotients in
    # [2**-125, 2**100]: here 10**6 pairs of full-precision significands, factors over
    # [2**-32, 2**32], quotients at both ends of that range and between. The product
    # alone is not enough, which the same check sees.
    rng = np.random.default_rng(1)
    n = 1_000_000
    b = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-32, 33, n)).astype(F32)
    q = rng.uniform(1, 2, n) * 2.0 ** rng.choice([-125, -110, -68, -20, 0, 40, 99], n)
    x = (q * b.astype(F64)).astype(F32)
    keep = (x >= 2.0 ** -100) & np.isfinite(x)
    x, b = x[keep], b[keep]
    assert x.size > n // 2
    y = rn32_quotient(np.ones_like(b), b)
    exact = rn32_quotient(x, b)
    assert np.count_nonzero(divide(x, b, y, 2) != exact) == 0
    assert np.count_nonzero(divide(x, b, y, 0) != exact) > 0
