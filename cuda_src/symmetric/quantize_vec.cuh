// Quantizing a vector of a group against its prepared divisor, and the division paths.
#pragma once
#include "common.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Quantizing a vector against a prepared divisor

// Any divisor: IEEE division and the full encoder (NaN, clamp).
template <typename Tin, typename Code, int VEC>
__device__ __forceinline__ CodeVec<Code, VEC> quantize_vec_div(const Vec<Tin, VEC>& x, float b) {
    float f[VEC];
    unpack(x, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = div_rn(f[i], b);
    return encode_vec<Code, VEC>(f);
}

// A scale that came from the group's own maximum: |x / scale| <= 448 (1 + 2**-23) while the
// scale is normal. SCALED prescales the dividends; CORR is the number of Newton corrections
// (common.cuh). CLAMP (int8 only) clamps the quotients to [-127, 127] first, where they may
// be larger but are finite: a given scale (quantize_static), or a scale that rounded down
// into the subnormals (amax * f32(1/127) of 190 units of 2**-149 is 1 unit, and 190 / 1
// would wrap as a code).
template <typename Tin, typename Code, int VEC, bool SCALED, int CORR, bool CLAMP = false>
__device__ __forceinline__ CodeVec<Code, VEC> quantize_vec_fast(const Vec<Tin, VEC>& x,
                                                                const DivPlan& p) {
    static_assert(!CLAMP || IsSame<Code, CodeInt8>::value, "fp8's conversion is its own clamp");
    float a[VEC], q[VEC];
    unpack(x, a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        q[i] = divide_fast<CORR>(SCALED ? mul_rn(a[i], p.pre) : a[i], p);
        if (CLAMP) q[i] = fclamp(q[i], -127.0f, 127.0f);
    }
    return encode_fast<Code, VEC>(q, a);
}

// How a group's quotients are computed: FAST (no prescale, the fewest corrections the
// values and scale allow), GENERAL (prescaled, two corrections: tiny scales, and scales
// set by the eps floor, which the one-correction check does not cover; int8 clamps there,
// since a subnormal scale is rounded by up to half its size), EXACT (div.rn: scale 0,
// inf, NaN). fp8 needs no clamp on any path: its conversion saturates.
enum DivPath { PATH_FAST = 0, PATH_GENERAL = 1, PATH_EXACT = 2 };
template <int P> struct PathTag { static constexpr int value = P; };

// Corrections on the fast path: none for power-of-two scales, one for 16-bit values
// against a scale from their own maximum, two otherwise (common.cuh, divide_fast).
template <typename Tv, int RULE> struct FastCorrections {
    static constexpr int value = PowerOfTwoRule<RULE>::value ? 0 : (sizeof(Tv) == 2 ? 1 : 2);
};

template <int RULE>
__device__ __forceinline__ int div_path(const DivPlan& p, u32 amax_bits, u32 eps_bits) {
    if (p.exact) return PATH_EXACT;
    if (p.scaled || (RULE == FLOOR_EPS && amax_bits < eps_bits)) return PATH_GENERAL;
    return PATH_FAST;
}

// ROUNDED: the scale was rounded to a 16-bit type after it was computed from the group's
// maximum (scale_dtype), so int8 quotients may pass 127 on the fast path too.
template <int PATH, int CORR, typename Tin, typename Code, int VEC, bool ROUNDED = false>
__device__ __forceinline__ CodeVec<Code, VEC> quantize_vec_on(const Vec<Tin, VEC>& x, const DivPlan& p) {
    constexpr bool INT8 = IsSame<Code, CodeInt8>::value;
    if constexpr (PATH == PATH_EXACT) {
        return quantize_vec_div<Tin, Code, VEC>(x, p.b_orig);
    } else if constexpr (PATH == PATH_GENERAL) {
        return quantize_vec_fast<Tin, Code, VEC, true, 2, INT8>(x, p);
    } else {
        return quantize_vec_fast<Tin, Code, VEC, false, CORR, INT8 && ROUNDED>(x, p);
    }
}

// Runs emit(PathTag<path>) with the path a compile-time constant, so that each path keeps
// its own encode and store (a shared tail would repack every code byte by byte).
template <typename Emit>
__device__ __forceinline__ void on_path(int path, Emit emit) {
    if (path == PATH_FAST) {
        emit(PathTag<PATH_FAST>{});
    } else if (path == PATH_GENERAL) {
        emit(PathTag<PATH_GENERAL>{});
    } else {
        emit(PathTag<PATH_EXACT>{});
    }
}

// x / smooth, one IEEE division per element (SmoothQuant).
template <typename Tin, int VEC>
__device__ __forceinline__ Vec<float, VEC> smooth_vec(const Vec<Tin, VEC>& x, const float* smooth) {
    Vec<float, VEC> r;
    float f[VEC];
    unpack(x, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) r.v[i] = div_rn(f[i], smooth[i]);
    return r;
}

// A vector of a group as the kernel holds it: the input itself, or (SMOOTH) x / smooth.
template <typename Tin, int VEC, bool SMOOTH>
__device__ __forceinline__ Vec<typename Conditional<SMOOTH, float, Tin>::type, VEC>
load_group_vec(const Tin* x, const float* smooth) {
    if constexpr (SMOOTH) {
        return smooth_vec<Tin, VEC>(load_vec<Tin, VEC>(x), load_vec<float, VEC>(smooth).v);
    } else {
        return load_vec<Tin, VEC>(x);
    }
}

// Codes of the vectors a thread holds of a group (its share of [0, len), TPG threads a
// group) against the group's divisor plan, on the division path `path` picks.
template <typename Tv, typename Code, int RULE, int VEC, int TPG, int NV, bool ROUNDED = false>
__device__ __forceinline__ void store_held_codes(typename Code::T* qg, const Vec<Tv, VEC> (&val)[NV],
                                                 int len, int lane, const DivPlan& plan, int path) {
    on_path(path, [&](auto tag) {
        constexpr int P = decltype(tag)::value, CORR = FastCorrections<Tv, RULE>::value;
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int e = (lane + j * TPG) * VEC;
            if (e < len)
                store_code_vec<Code, VEC>(qg + e, quantize_vec_on<P, CORR, Tv, Code, VEC, ROUNDED>(val[j], plan));
        }
    });
}

// Threads of a row-group block and the blocks per multiprocessor the compiler must fit.
// Teams that divide 256 threads share a block of 256; a team of any other multiple of 32
// (a row of 7168 bf16 takes 7 warps of four vectors) is a block of its own, so no warp
// idles through a pass. As many blocks as fit at 56 registers a thread (80 for
// SmoothQuant's float32 values): 4 of 256 threads (64 registers), 5 of 224, 7 of 160.
// A team sized to its row leaves no warp idle (a 7168-element row: 224 threads x 5 blocks,
// where 256 x 4 would idle a warp in eight). At 48 registers the kernels spill, and keeping
// more blocks resident beats prefetching the next group into registers, shared memory or
// L2.
template <int TPG, int VPT, bool SMOOTH> struct RowGroupShape {
    enum {
        threads = TPG >= 256 || 256 % TPG != 0 ? TPG : 256,
        fit = 65536 / (threads * (SMOOTH ? 80 : 56)),
        min_blocks = fit > 0 ? fit : 1
    };
};

}  // namespace cq
