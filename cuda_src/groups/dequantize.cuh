// The dequantizers: dequantize_groups and dequantize_groups_spanning.
#pragma once
#include "groups/units.cuh"

namespace cq {

// The dequantizer: units of VEC elements, UNROLL units a thread, loads first.
// D::Params holds what a group contributes; D::load(g, p0, p1) reads it, D::value(code, p)
// makes the float32 result. On the fast path a unit is 16 bytes of output (VEC = 8 for
// 16-bit types, 4 for float32) and lies in one group: g = unit / (G / VEC); on the general
// path (VEC = 1, or 2 for 4-bit codes) each element finds its own group: g = e / G.
// dequantize_groups_spanning (below) keeps 16-byte units where G is not a multiple of VEC.
// D::lane_param(g, second, p0, p1) and D::from_lanes(w, j) share a warp's parameters
// (dequant_warp_units); D::L2_PREFETCH has it prefetch a later warp's codes and
// parameters (D::param_addr) into L2.

// One unit's codes to its VEC outputs at out: element j takes the parameters prm[j] of
// its group, or prm[0] where the unit lies in one group (NP == 1).
template <class D, typename Tout, int VEC, int NP>
__device__ __forceinline__ void dequant_unit(const CodeUnit<D::BITS, VEC>& c, const typename D::Params (&prm)[NP],
                                             Tout* __restrict__ out) {
    float f[VEC];
    c.template decode<D::SIGNED, D::LOW_FIRST>(f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = D::value(f[j], prm[NP == 1 ? 0 : j]);
    store_unit<Tout, VEC>(out, convert_vec<Tout, VEC>(f));
}

template <class D, typename Tout, int VEC, int UNROLL>
__device__ __forceinline__ void dequant_units(const u8* __restrict__ q, const void* __restrict__ p0,
                                              const void* __restrict__ p1, Tout* __restrict__ out,
                                              i64 first, i64 step, i64 n_units, const FastDiv& div) {
    constexpr int NP = VEC >= 4 ? 1 : VEC;   // parameter sets a unit needs
    CodeUnit<D::BITS, VEC> c[UNROLL];
    typename D::Params prm[UNROLL][NP];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const i64 u = first + k * step;
        if (u < n_units) {
            c[k].load(q, u * VEC);
#pragma unroll
            for (int j = 0; j < NP; ++j) prm[k][j] = D::load(div.div(NP == 1 ? u : u * VEC + j), p0, p1);
        }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const i64 u = first + k * step;
        if (u < n_units) dequant_unit<D, Tout, VEC, NP>(c[k], prm[k], out + u * VEC);
    }
}

constexpr int DQ_THREADS = 256;
// The warp-shared dequantizers run eight blocks a multiprocessor (32 registers a thread),
// so that a wave of a 132-multiprocessor GPU is 132 x 64 warps: the warp whose codes a warp
// prefetches runs a wave later. The prefetching kernels are held to 32 registers (40
// without the bound), which keeps the eight blocks resident.
constexpr int DQ_WARP_BLOCKS = 8;
constexpr i64 DQ_L2_AHEAD = 132 * DQ_WARP_BLOCKS * (DQ_THREADS / 32);

// The fast path with the parameters shared by a warp: a warp takes 64 consecutive units
// (round k: unit base + 32 k + lane), whose groups are at most 16 when a group holds at
// least 4 units (the host's condition). Lane j of the first half loads the first parameter
// of the warp's group j, lane j of the second half its second, and shuffles hand them to
// the units: one load for the warp's groups where each unit's lane loaded its own.
template <class D, typename Tout, int VEC>
__device__ __forceinline__ void dequant_warp_units(const u8* __restrict__ q, const void* __restrict__ p0,
                                                   const void* __restrict__ p1, Tout* __restrict__ out,
                                                   i64 n_units, const FastDiv& div) {
    constexpr int ROUNDS = 2, WARPS = DQ_THREADS / 32;
    const int lane = threadIdx.x & 31;
    const i64 n_groups = div.div(n_units - 1) + 1;
    const i64 stride = (i64)gridDim.x * WARPS;
    // The bound is the warp's own, so every lane reaches the shuffles.
    for (i64 w = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); w * (32 * ROUNDS) < n_units; w += stride) {
        const i64 base = w * (32 * ROUNDS);
        if constexpr (D::L2_PREFETCH) {
            // Lanes 0-3 fetch into L2 the codes and first parameters of the warp a wave on,
            // so that its loads wait on L2 rather than on memory.
            const i64 fu = base + DQ_L2_AHEAD * (32 * ROUNDS);
            if (lane < 4 && (lane == 1 ? fu + 32 : fu) < n_units)
                prefetch_l2(lane < 2 ? (const void*)(q + (fu + 32 * lane) * (VEC * D::BITS / 8))
                                     : D::param_addr(div.div(fu), lane == 3, p0, p1));
        }
        CodeUnit<D::BITS, VEC> c[ROUNDS];
#pragma unroll
        for (int k = 0; k < ROUNDS; ++k) {
            const i64 u = base + 32 * k + lane;
            if (u < n_units) c[k].load(q, u * VEC);
        }
        const i64 g0 = div.div(base), g = g0 + (lane & 15);
        const float pw = g < n_groups ? D::lane_param(g, lane >= 16, p0, p1) : 0.0f;
#pragma unroll
        for (int k = 0; k < ROUNDS; ++k) {
            const i64 u = base + 32 * k + lane;
            const typename D::Params prm[1] = {D::from_lanes(pw, (int)(div.div(u) - g0))};
            if (u < n_units) dequant_unit<D, Tout, VEC, 1>(c[k], prm, out + u * VEC);
        }
    }
}

// n_units units of VEC elements; div divides by the units of a group (fast path) or by G.
// A thread's UNROLL units are a grid apart (measured faster than a block taking a
// contiguous chunk; the best UNROLL depends on the format, see the host side).
// WARP_PARAMS: dequant_warp_units instead (the fast path, groups of 4 units or more).
template <class D, typename Tout, int VEC, int UNROLL, bool WARP_PARAMS>
__global__ void __launch_bounds__(DQ_THREADS, WARP_PARAMS ? DQ_WARP_BLOCKS : 1)
dequantize_groups(const u8* __restrict__ q, const void* __restrict__ p0, const void* __restrict__ p1,
                  Tout* __restrict__ out, i64 n_units, i64 d, u32 magic, u32 shift) {
    const FastDiv div{d, magic, shift};
    if constexpr (WARP_PARAMS) {
        static_assert(VEC * sizeof(Tout) == 16, "the fast path's units");
        dequant_warp_units<D, Tout, VEC>(q, p0, p1, out, n_units, div);
    } else {
        const i64 step = (i64)gridDim.x * DQ_THREADS;
        for (i64 u = (i64)blockIdx.x * DQ_THREADS + threadIdx.x; u < n_units; u += step * UNROLL)
            dequant_units<D, Tout, VEC, UNROLL>(q, p0, p1, out, u, step, n_units, div);
    }
}

// Groups that are not whole 16-byte units of output (G % VEC != 0), with the codes and
// parameters aligned: the units stay 16 bytes of output, with one load of their codes, and
// each element takes its own group's parameters. NP = 2 where a unit spans two groups at
// most (G >= VEC), NP = VEC where it may span one group an element (G < VEC), where the
// general path would move a byte of codes a thread. The last n % VEC elements
// are the general path's units, taken by the grid's first thread.
template <class D, typename Tout, int VEC, int NP, int UNROLL>
__global__ void __launch_bounds__(DQ_THREADS)
dequantize_groups_spanning(const u8* __restrict__ q, const void* __restrict__ p0, const void* __restrict__ p1,
                           Tout* __restrict__ out, i64 n, i64 g, u32 magic, u32 shift) {
    static_assert(VEC * sizeof(Tout) == 16 && (NP == 2 || NP == VEC), "16-byte units, two groups or VEC");
    constexpr int GV = D::BITS == 4 ? 2 : 1;   // the general path's unit: a byte of codes
    const FastDiv div{g, magic, shift};
    const i64 n_units = n / VEC;
    if (blockIdx.x == 0 && threadIdx.x == 0 && n_units * VEC < n)
        dequant_units<D, Tout, GV, VEC / GV>(q, p0, p1, out, n_units * (VEC / GV), 1, n / GV, div);
    const i64 step = (i64)gridDim.x * DQ_THREADS;
    for (i64 u = (i64)blockIdx.x * DQ_THREADS + threadIdx.x; u < n_units; u += step * UNROLL) {
        CodeUnit<D::BITS, VEC> c[UNROLL];
        typename D::Params prm[UNROLL][NP];
        int split[UNROLL];   // NP == 2: the unit's first element of its second group, or VEC
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 uk = u + k * step;
            if (uk < n_units) {
                c[k].load(q, uk * VEC);
                const i64 g0 = div.div(uk * VEC), r0 = uk * VEC - g0 * g;
                if constexpr (NP == 2) {
                    split[k] = g - r0 < VEC ? (int)(g - r0) : VEC;
                    prm[k][0] = D::load(g0, p0, p1);
                    // The next group where the unit reaches it, else this one again.
                    prm[k][1] = D::load(split[k] < VEC ? g0 + 1 : g0, p0, p1);
                } else {
                    i64 gj = g0, rj = r0;
#pragma unroll
                    for (int j = 0; j < VEC; ++j) {
                        prm[k][j] = D::load(gj, p0, p1);
                        if (++rj == g) {
                            rj = 0;
                            ++gj;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 uk = u + k * step;
            if (uk < n_units) {
                typename D::Params pe[VEC];   // each element's
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    pe[j] = NP == VEC ? prm[k][j % NP] : j >= split[k] ? prm[k][1] : prm[k][0];
                dequant_unit<D, Tout, VEC, VEC>(c[k], pe, out + uk * VEC);
            }
        }
    }
}

}  // namespace cq
