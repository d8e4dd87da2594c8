// Reductions over lanes and threads, run-time division of indices, and the
// grid-wide handshake of single-launch two-phase kernels.
#pragma once
#include "common/base.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Reductions over lanes

// Max over the aligned run of W consecutive lanes (W a power of two, at most 32).
template <int W>
__device__ __forceinline__ u32 lanes_max(u32 v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = umax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Max over a run of W consecutive threads of a block (W a power of two); every thread of
// the run gets the result. W > 32 uses `scratch` (one word per warp) and __syncthreads, so
// every thread of the block must call it.
template <int W>
__device__ __forceinline__ u32 group_max(u32 v, u32* scratch) {
    if constexpr (W <= 32) {
        return lanes_max<W>(v);
    } else {
        v = lanes_max<32>(v);
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        __syncthreads();  // scratch may still be read by a previous call
        if (lane == 0) scratch[warp] = v;
        __syncthreads();
        const int wpg = W / 32, first = (warp / wpg) * wpg;
        u32 r = 0;
        for (int i = 0; i < wpg; ++i) r = umax(r, scratch[first + i]);
        return r;
    }
}

// ---------------------------------------------------------------------------------------
// Division of non-negative 64-bit indices by a run-time divisor d < 2**31: a multiply and
// shift (Granlund-Montgomery) while n < 2**31, a true division above.

struct FastDiv {
    i64 d;
    u32 magic, shift;
    __device__ __forceinline__ i64 div(i64 n) const {
        if ((u64)n < 0x80000000ull) {
            u32 n32 = (u32)n;
            return (i64)((__umulhi(n32, magic) + n32) >> shift);
        }
        return n / d;
    }
};

// ---------------------------------------------------------------------------------------
// Grid-wide handshake for single-launch two-phase kernels.
// ws[0]: running maximum, ws[1]: blocks arrived, ws[2]: blocks departed. The last block to
// depart zeroes all three, so the next launch on the same stream finds them clean.

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 atom_add_acq_rel(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void atom_max_relaxed(u32* p, u32 v) {
    asm volatile("red.relaxed.gpu.global.max.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed(u32* p, u32 v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// Called by every thread of every block with the block's value in `v` (already reduced
// across the block); returns the maximum over the grid to every thread.
__device__ __forceinline__ u32 grid_max(u32 v, u32* ws, u32* shared_word) {
    __syncthreads();
    if (threadIdx.x == 0) {
        atom_max_relaxed(&ws[0], v);
        atom_add_acq_rel(&ws[1], 1u);                 // release: the max is visible first
        while (ld_acquire(&ws[1]) < gridDim.x) { __nanosleep(32); }
        u32 m = ld_acquire(&ws[0]);
        *shared_word = m;
        if (atom_add_acq_rel(&ws[2], 1u) == gridDim.x - 1u) {  // last to leave cleans up
            st_relaxed(&ws[0], 0u);
            st_relaxed(&ws[1], 0u);
            st_relaxed(&ws[2], 0u);
        }
    }
    __syncthreads();
    return *shared_word;
}

}  // namespace cq
