// quantize_static: a given scale.
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// A given scale: *scale_ptr when scale_ptr is set, else scale_value (then also written to
// scale_out[0]). Any dividend may meet any divisor here, so the division is div.rn, except
// for int8 vectors that int8_static_bound admits. Each block takes a contiguous chunk of
// UNROLL * 256 vectors at a time.

// For int8 and a divisor b with 2**-60 <= |b| < 2**126 (a plan neither exact nor
// prescaled): the bits of the largest finite magnitude of Tin at most 2**100 |b| (both
// roundings toward zero, so never above it). In a vector no larger, every x / b is finite
// and within divide_by_reciprocal's range wherever its code can be nonzero (|x| >= |b| / 2
// >= 2**-61), so the reciprocal and a clamp give the codes, without div.rn or a NaN test.
template <typename Tin>
__device__ __forceinline__ u32 int8_static_bound(float b) {
    float m;
    asm("mul.rz.f32 %0, %1, %2;" : "=f"(m) : "f"(u2f(f2u(b) & 0x7fffffffu)), "f"(0x1p100f));
    if constexpr (IsSame<Tin, float>::value) {
        return f2u(m);
    } else if constexpr (IsSame<Tin, bfloat16>::value) {
        return f2u(m) >> 16;
    } else {
        u16 h;
        asm("cvt.rz.f16.f32 %0, %1;" : "=h"(h) : "f"(m));
        return h;
    }
}

// Whether every |x| of a vector is at most the magnitude with bits `bound` (NaN is not).
template <typename Tin, int VEC>
__device__ __forceinline__ bool within_bound(const Vec<Tin, VEC>& x, u32 bound) {
    AbsMax<Tin> m;
    m.add(x);
    if constexpr (sizeof(Tin) == 2) {
        const u32 both = bound * 0x10001u;
        return max_u16x2(m.acc, both) == both;
    } else {
        return m.acc <= bound;
    }
}

template <typename Tin, typename Code, int VEC>
__global__ void __launch_bounds__(256)
quantize_static(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                const float* __restrict__ scale_ptr, float scale_value,
                float* __restrict__ scale_out, i64 n) {
    constexpr int THREADS = 256, UNROLL = 4, CHUNK = THREADS * UNROLL;
    // One correction is exact for 16-bit dividends and any divisor (common.cuh).
    constexpr int CORR = sizeof(Tin) == 2 ? 1 : 2;
    constexpr bool INT8 = IsSame<Code, CodeInt8>::value && VEC > 1;
    const float b = scale_ptr ? *scale_ptr : scale_value;
    if (scale_out && blockIdx.x == 0 && threadIdx.x == 0) scale_out[0] = b;
    const DivPlan plan = plan_division(b);
    // 0: no vector takes the fast path. A bound is finite, so NaN never passes it.
    const u32 bound = INT8 && !plan.exact && !plan.scaled ? int8_static_bound<Tin>(b) : 0u;
    const i64 nvec = n / VEC, tail = n - nvec * VEC;
    for (i64 c = (i64)blockIdx.x * CHUNK; c < nvec; c += (i64)gridDim.x * CHUNK) {
        Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c + k * THREADS + threadIdx.x;
            if (v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c + k * THREADS + threadIdx.x;
            if (v >= nvec) continue;
            if (INT8 && bound && within_bound(tmp[k], bound)) {
                store_code_vec<Code, VEC>(q + v * VEC,
                                          quantize_vec_fast<Tin, Code, VEC, false, CORR, INT8>(tmp[k], plan));
            } else {
                store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_div<Tin, Code, VEC>(tmp[k], b));
            }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < tail) {
        const i64 i = nvec * VEC + threadIdx.x;
        store_code_vec<Code, 1>(q + i, quantize_vec_div<Tin, Code, 1>(load_vec<Tin, 1>(x + i), b));
    }
}

}  // namespace cq
