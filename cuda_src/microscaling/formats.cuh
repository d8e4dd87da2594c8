// The microscaling formats' rules (docs/formats.md section 9): E8M0 scales, e2m1 codes,
// NVFP4's global scales, and the swizzled scale layout.
#pragma once
#include "common.cuh"

namespace cq {

enum MxFormat { MXFP8 = 0, MXFP4 = 1, NVFP4 = 2 };
enum MxRounding { MX_NEAREST = 0, MX_RBITS = 1, MX_PHILOX = 2 };
enum MxScaleMode { MX_RCEIL = 0, MX_FLOOR = 1 };

constexpr u32 FLT_MAX_BITS = 0x7f7fffffu;
constexpr u32 F32_NAN = 0x7fffffffu;

template <int FMT> struct MxTraits {
    static constexpr int BLOCK = FMT == NVFP4 ? 16 : 32;
    static constexpr bool FP4 = FMT != MXFP8;
    static constexpr int EMAX = FMT == MXFP8 ? 8 : 2;   // the element format's largest exponent
};

// min(v, m) for v >= 0 or NaN, NaN kept (fminf would drop it), on the bits.
__device__ __forceinline__ float min_keep_nan(float v, u32 m_bits) {
    const u32 b = f2u(v);
    return (b > m_bits && b <= 0x7f800000u) ? u2f(m_bits) : v;
}

// ---------------------------------------------------------------------------------------
// E8M0 scales

// The scale byte of a block from its amax bits (|x| bits: NaN above infinity). inv_max is
// f32(1/448) or f32(1/6) (rceil's d = amax * C(1/max)).
template <int FMT>
__device__ __forceinline__ u32 e8m0_byte(u32 amax, int mode, float inv_max) {
    // Both rules without branches (mode is the same for every lane).
    const u32 d = f2u(mul_rn(u2f(amax), inv_max));
    const u32 e = d >> 23, m = d & 0x7fffffu;
    const u32 rceil = e + (m > (e > 0u ? 0u : 0x400000u) ? 1u : 0u);
    const int f = (int)(amax >> 23) - 127 - MxTraits<FMT>::EMAX;
    const u32 floor = (u32)(imin(imax(f, -127), 128) + 127);
    return amax >= 0x7f800000u ? 0xffu : mode == MX_RCEIL ? rceil : floor;
}

// 2**(127 - b), what a block's elements are multiplied by: b = 254 is subnormal, 255 NaN.
__device__ __forceinline__ float e8m0_inverse(u32 b) {
    return u2f(b == 255u ? F32_NAN : b == 254u ? 0x00400000u : (254u - b) << 23);
}

// 2**(b - 127), the dequantizers' scale: b = 0 is subnormal, 255 NaN.
__device__ __forceinline__ float e8m0_value(u32 b) {
    return u2f(b == 255u ? F32_NAN : b == 0u ? 0x00400000u : b << 23);
}

// ---------------------------------------------------------------------------------------
// e2m1 codes (sign in bit 3)

// The magnitude code of |v| rounded to nearest even on {0, 0.5, 1, 1.5, 2, 3, 4, 6},
// saturating at 6 (infinity too; a NaN gives 7, callers give NaN quotients code 0). With
// |v| clamped to 6 and E = max(exponent of |v|, 0), the grid's step is 2**(E - 1), which is
// the ulp of M = 1.5 * 2**(E + 22): |v| + M rounds |v| to the grid (half to even: M's last
// bit is 0), leaving n = |v| / step in its low bits, and the code is n + 2E.
__device__ __forceinline__ u32 e2m1_magnitude(float v) {
    // min takes the number when one operand is NaN; a subnormal |v| flushed to 0 by
    // -ftz=true gives 0 all the same.
    const float a = fminf(fabsf(v), 6.0f);
    const u32 eb = umax(f2u(a) & 0x7f800000u, 0x3f800000u);
    const u32 m = eb + 0x0b400000u;
    return f2u(add_rn(a, u2f(m))) - m + (eb >> 22) - 254u;
}

// The same for two quotients held as float16 pairs (low half first), which they are
// exactly where it matters: an MX quotient of a 16-bit input is that input times a power of
// two, exact in float16 from 2**-14 up (below, every code is 0) to the float16 maximum
// (above, infinity saturates as well). The same steps on both halves at once: float16 has
// 10 mantissa bits, so M = 1.5 * 2**(E + 9), and n + 2E = s - M + (eb >> 9) - 30 a half.
// Returns the codes in bits 0-2 and 16-18.
__device__ __forceinline__ u32 e2m1_magnitude_x2(u32 h) {
    u32 a, s;
    asm("min.f16x2 %0, %1, %2;" : "=r"(a) : "r"(h & 0x7fff7fffu), "r"(0x46004600u));
    const u32 eb = max_u16x2(a & 0x7c007c00u, 0x3c003c00u);
    const u32 m = eb + 0x26002600u;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(s) : "r"(a), "r"(m));
    return s - eb + (eb >> 9) - 0x261e261eu;   // s - m + (eb >> 9) - 30, a half each
}

// The magnitude codes of eight quotients packed (element i in nibble i): e2m1_magnitude's
// steps, with n + 2E = s - eb + (eb >> 22) - 254 - 0x0b400000 (s = |v| + M, M = eb +
// 0x0b400000) summed into the word by multiply-adds and the constant taken off once, so
// that an element costs no shift, mask or merge of its own.
__device__ __forceinline__ u32 e2m1_magnitudes8(const float* v) {
    u32 acc = 0u - (254u + 0x0b400000u) * 0x11111111u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = fminf(fabsf(v[i]), 6.0f);
        const u32 eb = umax(f2u(a) & 0x7f800000u, 0x3f800000u);
        const u32 s = f2u(add_rn(a, u2f(eb + 0x0b400000u)));
        acc += (s - eb + (eb >> 22)) << (4 * i);
    }
    return acc;
}

// The magnitude codes of |x| * 2**k for a bfloat16 pair x (low half first) and inv2 the
// bfloat16 pair of 2**k (normal or subnormal): the product is exact where it matters (a
// bfloat16 has float32's exponent range: only results below 2**-126, whose code is 0,
// round), so e2m1_magnitude_x2's steps run on bfloat16 pairs: 7 mantissa bits, M = 1.5 *
// 2**(E + 6), n + 2E = s - eb + (eb >> 6) - 0x43e a half. Codes in bits 0-2 and 16-18.
__device__ __forceinline__ u32 e2m1_magnitude_bf16x2(u32 x, u32 inv2) {
    u32 a, s;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a) : "r"(x & 0x7fff7fffu), "r"(inv2), "r"(0x80008000u));
    asm("min.bf16x2 %0, %1, %2;" : "=r"(a) : "r"(a), "r"(0x40c040c0u));
    const u32 eb = max_u16x2(a & 0x7f807f80u, 0x3f803f80u);
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(s) : "r"(a), "r"(0x3f803f80u), "r"(eb + 0x03400340u));
    return s - eb + (eb >> 6) - 0x043e043eu;
}

// The sign bits of eight 16-bit values (element 2k in the low half of w[k]) at bit 3 of
// nibble i, by byte permutes: the high bytes gathered, then each byte's sign replicated.
__device__ __forceinline__ u32 e2m1_signs8(const u32* w) {
    const u32 h01 = prmt(w[0], w[1], 0x7531u), h23 = prmt(w[2], w[3], 0x7531u);
    return (prmt(h01, h23, 0xECA8u) & 0x08080808u) | (prmt(h01, h23, 0xFDB9u) & 0x80808080u);
}

// e2m1 code with the sign in bit 3 (also for -0); NaN gives 0.
__device__ __forceinline__ u32 e2m1_nearest(float v) {
    const u32 b = f2u(v);
    return (b & 0x7fffffffu) > 0x7f800000u ? 0u : (((b >> 28) & 8u) | e2m1_magnitude(v));
}

// Stochastic rounding on the same grid: between grid points lo <= |v| < hi, up iff
// f32(word >> 8) < (|v| - lo) / (hi - lo) * 2**24; 6 and above give 6. The magnitude codes
// of N <= 8 quotients packed (element i in nibble i, as e2m1_magnitudes8), from their
// magnitudes |v| and their words. With a = min(|v|, 6), E = max(exponent of a, 0) and the
// step 2**(E - 1) of a's stretch of the grid, up iff a - r24 * step / 2**24 > lo, so the
// code is ceil((a - r24 * step / 2**24) / step) + 2E: the difference rounded up (fma.rp),
// then rounded up to a multiple of the step by adding M = 1.5 * 2**(E + 22) (add.rp), whose
// ulp is the step. Rounding up never crosses a grid point (they are floats), so both
// roundings leave the ceiling as it is, and the comparison is exact however small a is
// (subnormals kept: integer min and max, unflushed PTX). A NaN quotient gives 7; callers
// zero a NaN block's codes.
template <int N>
__device__ __forceinline__ u32 e2m1_stochastic_magnitudes(const float* v, const u32* word) {
    u32 acc = 0u - (254u + 0x0b400000u) * (0x11111111u >> (32 - 4 * N));
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const u32 a = umin(f2u(v[i]), 0x40c00000u);
        const u32 eb = umax(a, 0x3f800000u) & 0x7f800000u;
        const float r = __uint2float_rn(word[i] & 0xffffff00u);    // r24 * 2**8, exact
        const float nstep = u2f(eb + (0x80000000u - (33u << 23)));  // -step * 2**-32
        const u32 s = f2u(fma_add_rp(r, nstep, u2f(a), u2f(eb + 0x0b400000u)));
        acc += (s - eb + (eb >> 22)) << (4 * i);
    }
    return acc;
}

// The value of an e2m1 code: (c & 7) << 22 is 2**-126 times it as float bits (codes 0 and
// 1 subnormal), so one exact multiply by 2**126 makes it.
__device__ __forceinline__ float e2m1_decode(u32 c) {
    return mul_rn(u2f(((c & 7u) << 22) | ((c & 8u) << 28)), 8.5070591730234616e37f);
}

// Eight codes (element i in nibble i) as the bfloat16 bits of their values, two a word
// (element 2k in the low half of o[k]), exact: each magnitude's two bytes looked up by
// byte permutes (0x00, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0), each
// nibble's bit 3 moved to bit 7 of its high byte. 16 instructions for 8 elements.
__device__ __forceinline__ void e2m1x8_bf16(u32 w, u32 (&o)[4]) {
    const u32 m = w & 0x77777777u, w4 = w << 4;
    const u32 sa = prmt(w4, w, 0x5140u), sb = prmt(w4, w, 0x7362u);   // sign i at bit 8i+7
    const u32 ha = prmt(0x3f3f3f00u, 0x40404040u, m) | (sa & 0x80808080u);
    const u32 la = prmt(0xc0800000u, 0xc0804000u, m);
    const u32 hb = prmt(0x3f3f3f00u, 0x40404040u, m >> 16) | (sb & 0x80808080u);
    const u32 lb = prmt(0xc0800000u, 0xc0804000u, m >> 16);
    o[0] = prmt(la, ha, 0x5140u);
    o[1] = prmt(la, ha, 0x7362u);
    o[2] = prmt(lb, hb, 0x5140u);
    o[3] = prmt(lb, hb, 0x7362u);
}

// ---------------------------------------------------------------------------------------
// NVFP4's global scales

struct NvGlobal {
    float enc;   // S_enc = 1 if A == 0 else min(f32(2688 / A), FLT_MAX), NaN kept
    float dec;   // S_dec = f32(1 / S_enc)
};

__device__ __forceinline__ NvGlobal nv_global(float a) {
    NvGlobal g;
    g.enc = f2u(a) == 0u ? 1.0f : min_keep_nan(div_rn(2688.0f, a), FLT_MAX_BITS);
    g.dec = div_rn(1.0f, g.enc);
    return g;
}

// The e4m3 byte of a block's scale: e4m3(min(amax_b * factor, 448)), factor =
// f32(S_enc * C(1/6)); NaN as 0x7F, no lower clamp.
__device__ __forceinline__ u32 nv_scale_byte(u32 amax, float factor) {
    return CodeE4M3::encode(min_keep_nan(mul_rn(u2f(amax), factor), 0x43e00000u));
}

// r = min(f32(1 / f32(f32(s) * S_dec)), FLT_MAX), what a block's elements are multiplied by.
__device__ __forceinline__ float nv_inverse(u32 s, float dec) {
    return min_keep_nan(div_rn(1.0f, mul_rn(CodeE4M3::decode((u8)s), dec)), FLT_MAX_BITS);
}

// ---------------------------------------------------------------------------------------
// The swizzled layout: scale (r, c) of [M, C], with cp4 = ceil(C / 4).
__device__ __forceinline__ i64 swizzled_index(i64 r, i64 c, i64 cp4) {
    return (((r >> 7) * cp4 + (c >> 2)) << 9) + ((r & 31) << 4) + (((r & 127) >> 5) << 2) + (c & 3);
}

// The swizzled layout's padding (rows M..R'-1 and columns C..C'-1), zeroed by the threads
// of the grid together: a kernel writes every byte of its outputs.
__device__ __forceinline__ void zero_swizzle_padding(u8* scales, i64 m, i64 c, i64 cp4) {
    const i64 cp = cp4 * 4, rp = ((m + 127) >> 7) << 7;
    const i64 below = (rp - m) * cp, right = m * (cp - c), total = below + right;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < total; p += stride) {
        i64 r, col;
        if (p < below) {
            r = m + p / cp;
            col = p - (r - m) * cp;
        } else {
            const i64 q = p - below, w = cp - c;
            r = q / w;
            col = c + (q - r * w);
        }
        scales[swizzled_index(r, col, cp4)] = 0;
    }
}

}  // namespace cq
