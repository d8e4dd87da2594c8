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
    if (amax >= 0x7f800000u) return 0xffu;
    if (mode == MX_RCEIL) {
        const u32 d = f2u(mul_rn(u2f(amax), inv_max));
        const u32 e = d >> 23, m = d & 0x7fffffu;
        return e + (e > 0u ? (m != 0u) : (m > 0x400000u));
    }
    const int b = (int)(amax >> 23) - 127 - MxTraits<FMT>::EMAX;
    return (u32)(imin(imax(b, -127), 128) + 127);
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
    float a;   // min.f32 takes the number when one operand is NaN
    asm("min.f32 %0, %1, 0f40C00000;" : "=f"(a) : "f"(u2f(f2u(v) & 0x7fffffffu)));
    const u32 eb = umax(f2u(a) & 0x7f800000u, 0x3f800000u);
    const u32 m = eb + 0x0b400000u;
    return f2u(add_rn(a, u2f(m))) - m + (eb >> 22) - 254u;
}

// e2m1 code with the sign in bit 3 (also for -0); NaN gives 0.
__device__ __forceinline__ u32 e2m1_nearest(float v) {
    const u32 b = f2u(v);
    return (b & 0x7fffffffu) > 0x7f800000u ? 0u : (((b >> 28) & 8u) | e2m1_magnitude(v));
}

// Stochastic rounding on the same grid: between grid points lo <= |v| < hi, up iff
// f32(word >> 8) < (|v| - lo) / (hi - lo) * 2**24; 6 and above give 6; NaN gives 0. From 1
// to 6 that fraction times 2**24 is the 22 mantissa bits below the grid's one, times 4.
__device__ __forceinline__ u32 e2m1_stochastic(float v, u32 word) {
    const u32 b = f2u(v), mag = b & 0x7fffffffu, r24 = word >> 8;
    u32 c;
    if (mag >= 0x40c00000u) {
        c = 7u;
    } else if (mag >= 0x3f800000u) {
        c = (mag >> 22) - 252u + (r24 < ((mag & 0x3fffffu) << 2) ? 1u : 0u);
    } else {
        const float t = mul_rn(u2f(mag), 2.0f);             // 2|v| < 2, exact
        const u32 fl = t >= 1.0f ? 1u : 0u;
        const float frac = mul_rn(sub_rn(t, (float)fl), 16777216.0f);   // exact
        c = fl + ((float)r24 < frac ? 1u : 0u);
    }
    return mag > 0x7f800000u ? 0u : (((b >> 28) & 8u) | c);
}

// The value of an e2m1 code: (c & 7) << 22 is 2**-126 times it as float bits (codes 0 and
// 1 subnormal), so one exact multiply by 2**126 makes it.
__device__ __forceinline__ float e2m1_decode(u32 c) {
    return mul_rn(u2f(((c & 7u) << 22) | ((c & 8u) << 28)), 8.5070591730234616e37f);
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
