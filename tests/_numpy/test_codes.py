"""The code formats themselves, against references written from the format definitions
(not from the library): float8_e4m3fn decoding of all 256 codes, encoding at and around
every rounding boundary, int8 rounding of ties, power-of-two scales, canonical NaN."""

import math

import ml_dtypes
import numpy as np
import pytest

from cuquant._numpy import _core

FP8 = ml_dtypes.float8_e4m3fn


def e4m3_value(code: int) -> float:
    """float8_e4m3fn by definition: 1 sign, 4 exponent (bias 7), 3 mantissa bits; the
    all-ones pattern (S.1111.111) is NaN, there are no infinities."""
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1 + m / 8) * 2.0 ** (e - 7)


FINITE = sorted({e4m3_value(c) for c in range(256) if not math.isnan(e4m3_value(c))})


def e4m3_encode_reference(v: float) -> int:
    """Nearest e4m3fn value of clamp(v, -448, 448), ties to the even code; NaN -> 0x7F."""
    if math.isnan(v):
        return 0x7F
    c = min(max(v, -448.0), 448.0)
    best = None
    for code in range(256):
        val = e4m3_value(code)
        if math.isnan(val) or (val == 0 and math.copysign(1, val) != math.copysign(1, c)):
            continue
        d = abs(val - c)
        if best is None or d < best[0] or (d == best[0] and code % 2 == 0 and best[1] % 2 == 1):
            best = (d, code)
    return best[1]


def test_decode_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    got = _core.decode(codes, _core.E4M3)
    for c in range(256):
        want = e4m3_value(c)
        if math.isnan(want):
            assert math.isnan(got[c])
        else:
            assert got[c] == want and math.copysign(1, got[c]) == math.copysign(1, want), c


def _boundary_values():
    """Every e4m3 value, every midpoint between neighbours, and one float32 ulp either side."""
    vals = []
    pos = [v for v in FINITE if v >= 0]
    for a, b in zip(pos, pos[1:]):
        mid = np.float32((a + b) / 2)  # exact: midpoints of e4m3 values fit in float32
        vals += [a, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1e9))]
    vals += [448.0, 449.0, 464.0, 480.0, 1e30, np.inf, 2.0 ** -10, 2.0 ** -11, 1e-40, 0.0]
    v = np.array(vals, dtype=np.float32)
    return np.concatenate([v, -v])


def test_encode_boundaries_against_reference():
    v = _boundary_values()
    got = _core.encode_e4m3(v).view(np.uint8)
    want = np.array([e4m3_encode_reference(float(x)) for x in v], dtype=np.uint8)
    np.testing.assert_array_equal(got, want)


def test_encode_specials_by_hand():
    v = np.array([np.nan, -np.nan, 0.0, -0.0, 448.0, -1000.0, np.inf, -np.inf, 0.0009765625,
                  0.00146484375, 2.0 ** -9], dtype=np.float32)
    got = _core.encode_e4m3(v).view(np.uint8).tolist()
    # NaN of either sign is the canonical 0x7F; -0 is 0x80; 2**-10 is a tie -> 0 (even);
    # 1.5 * 2**-10 rounds up to the smallest subnormal 0x01.
    assert got == [0x7F, 0x7F, 0x00, 0x80, 0x7E, 0xFE, 0x7E, 0xFE, 0x00, 0x01, 0x01]


def test_int8_encode_ties_to_even_and_clamps():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, 300.0, -np.inf,
                  np.nan, 1e-45, -0.49999997], dtype=np.float32)
    assert _core.encode_int8(v).tolist() == [0, 2, 2, 0, -2, -2, 126, 127, -127, 127, -127, 0,
                                              0, 0]


@pytest.mark.parametrize("value,want", [
    (1.0, 1.0), (1.5, 2.0), (0.75, 1.0), (2.0 ** -130, 2.0 ** -130),     # exact powers stay
    (3 * 2.0 ** -149, 4 * 2.0 ** -149), (2.0 ** -127 + 2.0 ** -149, 2.0 ** -126),
    (3.4e38, math.inf), (0.0, 0.0),
])
def test_ceil_pow2(value, want):
    got = _core.ceil_pow2(np.array([value], dtype=np.float32))[0]
    assert got == np.float32(want)


def test_canonical_nan_bits():
    a = np.array([np.nan, -np.nan, 1.0], dtype=np.float32)
    a.view(np.uint32)[0] = 0x7FC00001
    _core.canonical_nan(a, 0x7FFFFFFF)
    assert a.view(np.uint32).tolist()[:2] == [0x7FFFFFFF, 0x7FFFFFFF]
    h = np.array([np.nan, 2.0], dtype=ml_dtypes.bfloat16)
    _core.canonical_nan(h, 0x7FFF)
    assert h.view(np.uint16)[0] == 0x7FFF


def test_fastdiv_magic_matches_integer_division(rng):
    from cuquant._cuda.launch import fastdiv

    divisors = [1, 2, 3, 7, 56, 127, 448, 896, 1000, 65535, (1 << 31) - 1, 1 << 30, 12345677]
    divisors += rng.integers(1, 1 << 31, size=50).tolist()
    for d in divisors:
        magic, shift = (int(v) for v in fastdiv(d))
        n = np.concatenate([rng.integers(0, 1 << 31, size=2000, dtype=np.int64),
                            np.array([0, 1, d - 1, d, d + 1, 2 * d - 1, (1 << 31) - 1])])
        n = n[(n >= 0) & (n < (1 << 31))].astype(np.uint64)
        hi = (n * np.uint64(magic)) >> np.uint64(32)
        q = ((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)
        np.testing.assert_array_equal(q, n // np.uint64(d), err_msg=f"d={d}")
