// Conversions between float32 and the 16-bit storage types, without flushing.
#pragma once
#include "common/arith.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Element conversions

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<half>(half v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
template <> __device__ __forceinline__ float to_f32<bfloat16>(bfloat16 v) {
    return u2f(((u32)v.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ half from_f32<half>(float v) {
    half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}
template <> __device__ __forceinline__ bfloat16 from_f32<bfloat16>(float v) {
    bfloat16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

// Two floats rounded to a 16-bit type and packed, lo in the low half (one instruction).
template <typename T> __device__ __forceinline__ u32 pack_pair(float lo, float hi);
template <> __device__ __forceinline__ u32 pack_pair<half>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack_pair<bfloat16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// |v| as float bits; a NaN stays above every number, so an unsigned max of these bits is
// the NaN-propagating, subnormal-keeping maximum of |v|.
template <typename T> __device__ __forceinline__ u32 abs_bits(T v);
template <> __device__ __forceinline__ u32 abs_bits<float>(float v) { return f2u(v) & 0x7fffffffu; }
template <> __device__ __forceinline__ u32 abs_bits<half>(half v) {
    return f2u(to_f32(half{(u16)(v.bits & 0x7fffu)}));
}
template <> __device__ __forceinline__ u32 abs_bits<bfloat16>(bfloat16 v) {
    return ((u32)(v.bits & 0x7fffu)) << 16;
}

// The sign bit of a value (1 for negative numbers, -0 and NaNs with the bit set).
__device__ __forceinline__ u32 sign_bit(float v) { return f2u(v) >> 31; }
__device__ __forceinline__ u32 sign_bit(half v) { return (u32)v.bits >> 15; }
__device__ __forceinline__ u32 sign_bit(bfloat16 v) { return (u32)v.bits >> 15; }

}  // namespace cq
