// Scale rules: a group's scale from its maximum.
#pragma once
#include "common/codes.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Scale rules (docs/formats.md sections 3 and 4). inv_qmax is f32(1/qmax); eps_bits the floor's bits.

// ZERO_IS_ONE: amax * inv_qmax, 1 for amax 0; FLOOR_EPS: max(amax, eps) * inv_qmax; the
// _POW2 rules round that up to a power of two (UE8M0 scales). Each product is at least
// 2**-149.
enum ScaleRule { ZERO_IS_ONE = 0, FLOOR_EPS = 1, FLOOR_EPS_POW2 = 2, ZERO_IS_ONE_POW2 = 3 };

template <int RULE> struct PowerOfTwoRule {
    static constexpr bool value = RULE == FLOOR_EPS_POW2 || RULE == ZERO_IS_ONE_POW2;
};

// Smallest power of two >= s, from the bits; NaN and inf stay.
__device__ __forceinline__ float ceil_pow2(float s) {
    u32 b = f2u(s);
    u32 mag = b & 0x7fffffffu;
    if (mag >= 0x7f800000u || mag == 0u) return s;
    if (mag < 0x00800000u) {                       // subnormal: next power of two of the bits
        u32 p = 1u;
        while (p < mag) p <<= 1;
        return u2f((b & 0x80000000u) | p);
    }
    if ((mag & 0x007fffffu) == 0u) return s;
    return u2f((b & 0x80000000u) | ((mag & 0x7f800000u) + 0x00800000u));
}

// A nonzero product never rounds to a zero scale: below 2**-150 it is raised to the smallest
// subnormal, so a group of tiny values keeps finite codes (a zero scale would make them
// NaN and +-max). amax and inv_qmax are >= 0, so the bits order as the values.
__device__ __forceinline__ float at_least_min_subnormal(float s) {
    return u2f(umax(f2u(s), 1u));
}

template <int RULE>
__device__ __forceinline__ float scale_from_amax(u32 amax_bits, float inv_qmax, u32 eps_bits) {
    if (RULE == ZERO_IS_ONE) {
        return amax_bits == 0u ? 1.0f : at_least_min_subnormal(mul_rn(u2f(amax_bits), inv_qmax));
    }
    if (RULE == ZERO_IS_ONE_POW2) {
        return amax_bits == 0u ? 1.0f
                               : ceil_pow2(at_least_min_subnormal(mul_rn(u2f(amax_bits), inv_qmax)));
    }
    float s = at_least_min_subnormal(mul_rn(u2f(umax(amax_bits, eps_bits)), inv_qmax));
    return RULE == FLOOR_EPS_POW2 ? ceil_pow2(s) : s;
}

}  // namespace cq
