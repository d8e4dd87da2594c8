// Vector memory access: N elements of T in one aligned access.
#pragma once
#include "common/convert.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Vector memory access: N elements of T in one aligned access (16 bytes at most).

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
    return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
    *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// A vector read once, not kept in L1 (ld.global.nc.L1::no_allocate), so that what is read
// again there stays: the INT8 dequantizers' code loads take it, so that their per-row and
// per-block scales stay in L1. The FP8 ones measured slower with it (docs/performance.md),
// so only the INT8 path uses it.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_stream(const T* p) {
    constexpr int BYTES = (int)sizeof(T) * N;
    if constexpr (BYTES == 16) {
        Vec<T, N> r;
        u32* w = reinterpret_cast<u32*>(&r);
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
        return r;
    } else if constexpr (BYTES == 8) {
        Vec<T, N> r;
        u32* w = reinterpret_cast<u32*>(&r);
        asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
        return r;
    } else if constexpr (BYTES == 4) {
        Vec<T, N> r;
        asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(*reinterpret_cast<u32*>(&r)) : "l"(p));
        return r;
    } else {
        return load_vec<T, N>(p);
    }
}

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes copied from global memory to a shared-memory address (smem_addr) in the
// background (sm_80+), past L1; the copying thread sees them after cp_async_wait_all.
__device__ __forceinline__ void cp_async16(u32 smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// A hint: the line holding p (global memory) fetched into L2. A global pointer's generic
// address is its global one.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// A vector's elements as floats (exact). 16-bit types are unpacked two per 32-bit word.
template <typename T, int N>
__device__ __forceinline__ void unpack(const Vec<T, N>& x, float* f) {
    if constexpr (IsSame<T, bfloat16>::value && N % 2 == 0) {
        const u32* w = reinterpret_cast<const u32*>(&x);
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
            f[2 * k] = u2f(w[k] << 16);
            f[2 * k + 1] = u2f(w[k] & 0xffff0000u);
        }
    } else if constexpr (IsSame<T, half>::value && N % 2 == 0) {
        const u32* w = reinterpret_cast<const u32*>(&x);
#pragma unroll
        for (int k = 0; k < N / 2; ++k)
            asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
                : "=f"(f[2 * k]), "=f"(f[2 * k + 1]) : "r"(w[k]));
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = to_f32(x.v[i]);
    }
}

// Unsigned max of the two 16-bit halves of a and b, each.
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return umax(a & 0xffff0000u, b & 0xffff0000u) | umax(a & 0xffffu, b & 0xffffu);
#endif
}

// Running max of |x|: 16-bit types keep two packed maxima per word (the bits of |x| order
// like the values, NaN above inf), float keeps the float bits.
template <typename T>
struct AbsMax {
    u32 acc = 0;
    template <int N>
    __device__ __forceinline__ void add(const Vec<T, N>& x) {
        if constexpr (sizeof(T) == 2 && N % 2 == 0) {
            const u32* w = reinterpret_cast<const u32*>(&x);
#pragma unroll
            for (int k = 0; k < N / 2; ++k) acc = max_u16x2(acc, w[k] & 0x7fff7fffu);
        } else if constexpr (sizeof(T) == 2) {
#pragma unroll
            for (int i = 0; i < N; ++i) acc = max_u16x2(acc, (u32)(x.v[i].bits & 0x7fffu));
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) acc = umax(acc, abs_bits(x.v[i]));
        }
    }
    // The maximum as float32 bits.
    __device__ __forceinline__ u32 bits() const {
        if constexpr (sizeof(T) == 2) {
            const u16 m = (u16)umax(acc & 0xffffu, acc >> 16);
            return abs_bits(T{m});
        } else {
            return acc;
        }
    }
};

// Visits the vectors of a run [0, len) that lane `lane` of a TPG-thread team owns (every
// TPG-th vector of VEC elements), U loads in flight at a time: load(e) reads the vector at
// element e, visit(vector, e) uses it. For groups too long to hold, read twice.
template <int U, int TPG, int VEC, typename Load, typename Visit>
__device__ __forceinline__ void for_each_streamed(i64 len, int lane, Load load, Visit visit) {
    for (i64 e0 = (i64)lane * VEC; e0 < len; e0 += (i64)U * TPG * VEC) {
        decltype(load(e0)) tmp[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 e = e0 + (i64)k * TPG * VEC;
            if (e < len) tmp[k] = load(e);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 e = e0 + (i64)k * TPG * VEC;
            if (e < len) visit(tmp[k], e);
        }
    }
}

}  // namespace cq
