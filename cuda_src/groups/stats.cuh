// Group statistics: non-flushing minimum and maximum, packed two at a time for
// 16-bit data, and their reduction over a team.
#pragma once
#include "common.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Non-flushing min / max and comparisons

__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fmin_nan(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// Minimum of a value known not to be NaN (a NaN would give the bound).
__device__ __forceinline__ float fmin_num(float v, float hi) {
    float r;
    asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"(hi));
    return r;
}
__device__ __forceinline__ bool feq(float a, float b) {
    u32 r;
    asm("{ .reg .pred p; setp.eq.f32 p, %1, %2; selp.u32 %0, 1, 0, p; }" : "=r"(r) : "f"(a), "f"(b));
    return r != 0u;
}
// 1.0f if a < b, else 0.0f (one instruction).
__device__ __forceinline__ float set_lt(float a, float b) {
    float r;
    asm("set.lt.f32.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float add_rm(float a, float b) {
    float r;
    asm("add.rm.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fneg(float v) { return u2f(f2u(v) ^ 0x80000000u); }
__device__ __forceinline__ float fabs_bits(float v) { return u2f(f2u(v) & 0x7fffffffu); }
// finite (not inf, not NaN)
__device__ __forceinline__ bool finite(float v) { return (f2u(v) & 0x7fffffffu) < 0x7f800000u; }


// ---------------------------------------------------------------------------------------
// Packed 16-bit min / max

template <typename T> __device__ __forceinline__ u32 max2_nan(u32 a, u32 b);
template <typename T> __device__ __forceinline__ u32 min2_nan(u32 a, u32 b);
template <> __device__ __forceinline__ u32 max2_nan<half>(u32 a, u32 b) {
    u32 r;
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
template <> __device__ __forceinline__ u32 min2_nan<half>(u32 a, u32 b) {
    u32 r;
    asm("min.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
template <> __device__ __forceinline__ u32 max2_nan<bfloat16>(u32 a, u32 b) {
    u32 r;
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
template <> __device__ __forceinline__ u32 min2_nan<bfloat16>(u32 a, u32 b) {
    u32 r;
    asm("min.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// ---------------------------------------------------------------------------------------
// Minimum and maximum of a group. A thread accumulates; `pack` gives the words the team
// reduces with `combine` (the maximum and the negated minimum, so one max serves both);
// `unpack` reads lo and hi back as float32.

template <typename T, bool WIDE = (sizeof(T) == 2)>
struct MinMax {  // half, bfloat16: two elements a word
    static constexpr int WORDS = 1;
    static constexpr u32 NEG_INF2 = IsSame<T, half>::value ? 0xFC00FC00u : 0xFF80FF80u;
    u32 hi, lo;
    __device__ __forceinline__ MinMax() : hi(NEG_INF2), lo(NEG_INF2 ^ 0x80008000u) {}
    __device__ __forceinline__ void add_word(u32 w) {
        hi = max2_nan<T>(hi, w);
        lo = min2_nan<T>(lo, w);
    }
    __device__ __forceinline__ void add(T v) { add_word((u32)v.bits * 0x10001u); }
    template <int N>
    __device__ __forceinline__ void add_vec(const Vec<T, N>& v) {
        if constexpr (N % 2 == 0) {
            const u32* w = reinterpret_cast<const u32*>(&v);
#pragma unroll
            for (int k = 0; k < N / 2; ++k) add_word(w[k]);
        } else {
#pragma unroll
            for (int k = 0; k < N; ++k) add(v.v[k]);
        }
    }
    __device__ __forceinline__ void pack(u32* out) const {
        const u32 h = max2_nan<T>(hi, prmt(hi, 0u, 0x1032u)) & 0xffffu;
        const u32 l = min2_nan<T>(lo, prmt(lo, 0u, 0x1032u)) & 0xffffu;
        out[0] = h | ((l ^ 0x8000u) << 16);
    }
    static __device__ __forceinline__ u32 combine(u32 a, u32 b) { return max2_nan<T>(a, b); }
    static __device__ __forceinline__ void unpack(const u32* w, float& lo, float& hi) {
        T h, l;
        h.bits = (u16)(w[0] & 0xffffu);
        l.bits = (u16)((w[0] >> 16) ^ 0x8000u);
        hi = to_f32(h);
        lo = to_f32(l);
    }
};

template <>
struct MinMax<float, false> {
    static constexpr int WORDS = 2;
    float hi, lo;
    __device__ __forceinline__ MinMax() : hi(u2f(0xff800000u)), lo(u2f(0x7f800000u)) {}
    __device__ __forceinline__ void add(float v) {
        hi = fmax_nan(hi, v);
        lo = fmin_nan(lo, v);
    }
    template <int N>
    __device__ __forceinline__ void add_vec(const Vec<float, N>& v) {
#pragma unroll
        for (int k = 0; k < N; ++k) add(v.v[k]);
    }
    __device__ __forceinline__ void pack(u32* out) const {
        out[0] = f2u(hi);
        out[1] = f2u(lo) ^ 0x80000000u;
    }
    static __device__ __forceinline__ u32 combine(u32 a, u32 b) { return f2u(fmax_nan(u2f(a), u2f(b))); }
    static __device__ __forceinline__ void unpack(const u32* w, float& lo, float& hi) {
        hi = u2f(w[0]);
        lo = u2f(w[1] ^ 0x80000000u);
    }
};

// Reduces K words over each aligned run of W threads (W a power of two) with Acc::combine;
// every thread of the run gets the result. W > 32 goes through `scratch` (K words per warp)
// and a barrier (the block's, or the consumers' in a STAGED kernel), so every thread it
// covers must call it.
template <int W, class Acc, int K, bool STAGED = false>
__device__ __forceinline__ void team_reduce(u32 (&v)[K], u32* scratch) {
    constexpr int L = W < 32 ? W : 32;
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = Acc::combine(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
    }
    if constexpr (W > 32) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (STAGED) consumers_sync(); else __syncthreads();  // scratch may still be in use
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) scratch[warp * K + k] = v[k];
        }
        if (STAGED) consumers_sync(); else __syncthreads();
        constexpr int WPG = W / 32;
        const int first = (warp / WPG) * WPG;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            u32 r = scratch[first * K + k];
            for (int i = 1; i < WPG; ++i) r = Acc::combine(r, scratch[(first + i) * K + k]);
            v[k] = r;
        }
    }
}

}  // namespace cq
