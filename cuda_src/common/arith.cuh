// Non-flushing float arithmetic and exact division by a divisor shared by a group.
#pragma once
#include "common/base.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Non-flushing float arithmetic (IEEE round to nearest even, subnormals kept)

__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// |a| * b (the absolute value folds into the multiply's operand).
__device__ __forceinline__ float mul_abs_rn(float a, float b) {
    float r;
    asm("{\n\t.reg .f32 t;\n\tabs.f32 t, %1;\n\tmul.rn.f32 %0, t, %2;\n\t}" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
// rp(rp(a + r * n) + m): a difference rounded up (toward +infinity), then rounded up to a
// multiple of m's ulp: the stochastic e2m1 rule's exact comparison (microscaling/formats.cuh).
__device__ __forceinline__ float fma_add_rp(float r, float n, float a, float m) {
    float s;
    asm("{\n\t.reg .f32 d;\n\tfma.rp.f32 d, %1, %2, %3;\n\tadd.rp.f32 %0, d, %4;\n\t}"
        : "=f"(s) : "f"(r), "f"(n), "f"(a), "f"(m));
    return s;
}
__device__ __forceinline__ float div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// Clamp of a value known not to be NaN (a NaN would give the bound).
__device__ __forceinline__ float fclamp(float v, float lo, float hi) {
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"(lo));
    asm("min.f32 %0, %0, %1;" : "+f"(r) : "f"(hi));
    return r;
}
__device__ __forceinline__ float rcp_rn(float a) {
    float r;
    asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}

// ---------------------------------------------------------------------------------------
// Division by a divisor shared by a whole group.
//
// A group's divisor b is prepared once (DivPlan); each element then costs one multiply and
// two Newton corrections (fewer where divide_fast says they suffice), which give the
// correctly rounded quotient: y = RN(1/b) makes
// RN(a*y) within 1.5 ulp, the first correction makes it faithful and the second exact
// (Markstein). That holds while the remainders stay normal, which the plan guarantees for
// |a| <= 2**9 * |b| (every element of a group whose b came from the group's own maximum)
// by scaling a and b by 2**100 when b is tiny. Any other divisor (0, inf, NaN, huge) falls
// back to div.rn.f32 for the whole group.

struct DivPlan {
    float b;        // divisor, prescaled
    float nb;       // -b, so the corrections need no negation per element
    float y;        // RN(1/b)
    float pre;      // 1 or 2**100, applied to every dividend
    bool scaled;    // pre != 1
    bool exact;     // true: use div.rn.f32 on the original divisor
    float b_orig;
};

__device__ __forceinline__ DivPlan plan_division(float b) {
    DivPlan p;
    u32 mag = f2u(b) & 0x7fffffffu;
    p.b_orig = b;
    p.exact = !(mag >= 0x00000001u && mag < 0x7e800000u);   // 0, >= 2**126, inf, NaN
    p.scaled = mag < 0x21800000u;                             // b < 2**-60: scale by 2**100
    p.pre = p.scaled ? u2f(0x71800000u) : 1.0f;
    p.b = mul_rn(b, p.pre);
    p.nb = u2f(f2u(p.b) ^ 0x80000000u);
    p.y = rcp_rn(p.b);
    return p;
}

// a / b from y = RN(1/b) and nb = -b with CORR Newton corrections: q = RN(a * y), then
// q = fma(fma(q, nb, a), y, q) per correction. Correctly rounded while the remainders are
// exact and the quotients normal, which holds for normal y, |a| >= 2**-100 and
// 2**-125 <= |a / b| <= 2**100. Two corrections are exact for any such a (Markstein). One
// is exact for a 16-bit a (bf16 or fp16, at most 11 significant bits) and any b, checked
// over every pair of significands (tests/_cuda/test_gpu.py,
// test_division_by_reciprocal_every_16_bit_dividend). The sign of a zero or underflowing
// quotient may come out wrong; callers that care fix it.
template <int CORR>
__device__ __forceinline__ float divide_by_reciprocal(float a, float nb, float y) {
    float q = mul_rn(a, y);
#pragma unroll
    for (int i = 0; i < CORR; ++i) q = fma_rn(fma_rn(q, nb, a), y, q);
    return q;
}

// s / b for a prepared (not exact) plan and s already prescaled, |s| <= 2**9 |b| (which
// keeps it in the range above). One correction is also exact for any 16-bit s against
// b = RN(amax * f32(1/127)) or RN(amax * f32(1/448)) (tests/_cuda/test_division.py), and none
// is needed when b is a power of two (s * RN(1/b) is then the exact quotient).
template <int CORR = 2>
__device__ __forceinline__ float divide_fast(float s, const DivPlan& p) {
    return divide_by_reciprocal<CORR>(s, p.nb, p.y);
}

// a / b correctly rounded, for |a| <= 2**9 |b| or any a when p.exact.
__device__ __forceinline__ float divide(float a, const DivPlan& p) {
    if (p.exact) return div_rn(a, p.b_orig);
    float q = divide_fast(mul_rn(a, p.pre), p);
    // The quotient's sign is sign(a) ^ sign(b), also for zeros.
    return u2f((f2u(q) & 0x7fffffffu) | ((f2u(a) ^ f2u(p.b)) & 0x80000000u));
}

}  // namespace cq
