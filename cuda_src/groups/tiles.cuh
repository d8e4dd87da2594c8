// quantize_groups_tiles: a warp's tile of units held in registers.
#pragma once
#include "groups/quantize.cuh"

namespace cq {

// The quantizer on tiles held in registers, on the fast path, for groups of UPG 16-byte
// units (UPG divides 32). A warp takes a tile of 32 K consecutive units, lane l units
// l + 32 k (k < K), all loaded before the first is used. At step k the warp's 32 units are
// 32 / UPG whole groups of UPG lanes, reduced by shuffles (reduce_steps), after which each
// lane holds whole groups' statistics and prepares them: the format's prepare runs once
// for up to 32 groups, not once for each. The units take their group's Params from shared
// memory and are encoded from the registers. The data never passes through shared memory:
// the staged kernels' ring, with its barriers between a stage's arrival and its consumers,
// costs the zero point's quantizer more than it hides.
//
// A warp takes tiles a grid apart. The host sizes the grid to the device (DeepSpeed's
// format: each warp then takes many tiles, and with F::PREFETCH loads its next tile before
// it encodes this one, for 8 more registers of 16 bytes) or to the tiles (the zero point:
// a warp a tile, since its three outputs keep a warp's registers too busy for a second
// tile, and more resident warps cover each other's waits instead).
//
// The host launches it for at least one tile of units. The last tile, where the units do
// not fill it, is moved back to end with them: it overlaps the tile before, whose groups
// it writes again with the same values, and no load, statistic or store needs a bound.
// A tile with a group that needs the careful arithmetic encodes all its units with it (a
// warp-wide choice, so no lane waits on another's branch), reading them again from memory,
// which keeps the registers' loop lean; the careful arithmetic gives every group its bits.

constexpr int TILE_THREADS = 256;

// The tile's units to codes (and reconstructions): unit k of this lane from load(k, u),
// with the Params of its group at mine[k * GPS]. HELD: the units are in registers (an
// unrolled loop); otherwise each is read again, in a loop the compiler keeps rolled.
template <class F, typename T, int VEC, bool CAREFUL, bool ALT, int K, int GPS, bool HELD, typename Load>
__device__ __forceinline__ void emit_tile(const typename F::Params* mine, i64 u0, const QuantArgs& a,
                                          const u32* rbits, u8* q, T* deq, Load load) {
    auto one = [&](int k) {
        const i64 u = u0 + 32 * k + (threadIdx.x & 31);
        const typename F::Params pr[1] = {mine[k * GPS]};
        u32 rnd[VEC];
        F::template random<VEC>(rnd, u * VEC, a, rbits);
        emit_unit<F, T, VEC, 1, CAREFUL, ALT, true>(load(k, u), pr, rnd, 0, u * VEC, a, q, deq);
    };
    if constexpr (HELD) {
#pragma unroll
        for (int k = 0; k < K; ++k) one(k);
    } else {
#pragma unroll 1
        for (int k = 0; k < K; ++k) one(k);
    }
}

// The statistics of a warp's K steps, where at each step every aligned run of UPG lanes
// holds one group's packed words (MinMax::pack), reduced over the runs by a transposed
// butterfly: at each shuffle level (offset O) a lane keeps half its steps and sends the
// other half to its partner, which keeps those, so each level costs half the shuffles of
// the one before (15 for UPG = K = 16, against 64 for each step reduced in turn). Lane l
// ends with the reduced words of steps first, first + 1, ... in w[0], w[1], ...; once a lane
// keeps one step, the levels left reduce it in place, and lanes that differ only in those
// levels' bits hold the same group.
template <class Acc, int W, int K, int O, int N>
__device__ __forceinline__ void reduce_steps(u32 (&w)[K][W], int lane, int& first) {
    if constexpr (O > 0) {
        if constexpr (N >= 2) {
            constexpr int H = N / 2;
            const bool upper = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; ++i) {
#pragma unroll
                for (int j = 0; j < W; ++j) {
                    const u32 send = upper ? w[i][j] : w[i + H][j];
                    const u32 keep = upper ? w[i + H][j] : w[i][j];
                    w[i][j] = Acc::combine(keep, __shfl_xor_sync(0xffffffffu, send, O));
                }
            }
            if (upper) first += H;
            reduce_steps<Acc, W, K, O / 2, H>(w, lane, first);
        } else {
#pragma unroll
            for (int j = 0; j < W; ++j)
                w[0][j] = Acc::combine(w[0][j], __shfl_xor_sync(0xffffffffu, w[0][j], O));
            reduce_steps<Acc, W, K, O / 2, 1>(w, lane, first);
        }
    }
}

template <class F, typename T, int UPG, int K>
__global__ void __launch_bounds__(TILE_THREADS, F::TILE_BLOCKS)
quantize_groups_tiles(const T* __restrict__ x, u8* __restrict__ q, void* __restrict__ p0,
                      void* __restrict__ p1, T* __restrict__ deq, const u32* __restrict__ rbits,
                      i64 groups, i64 G, int mode, u32 seed_lo, u32 seed_hi) {
    typedef MinMax<T> Acc;
    typedef typename F::Params Params;
    constexpr int VEC = 16 / sizeof(T), WARPS = TILE_THREADS / 32, W = Acc::WORDS;
    constexpr int GPS = 32 / UPG, NG = K * GPS;
    // The groups a lane prepares (reduce_steps), and the lanes that hold a group another
    // lane prepares.
    constexpr int NF = K >= UPG ? K / UPG : 1, DUPLICATES = K < UPG ? UPG / K - 1 : 0;
    static_assert(32 % UPG == 0, "a step holds whole groups");
    __shared__ Params prm_of[WARPS][NG];
    const QuantArgs a{groups, G, G, mode, seed_lo, seed_hi};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 n_units = groups * UPG, tiles = (n_units + 32 * K - 1) / (32 * K);
    // The Params of this lane's unit at step k: mine[k * GPS].
    const Params* mine = &prm_of[warp][lane / UPG];
    const i64 stride = (i64)gridDim.x * WARPS;
    auto start = [&](i64 t) { return t * (32 * K) < n_units - 32 * K ? t * (32 * K) : n_units - 32 * K; };
    auto load_tile = [&](Vec<T, VEC> (&v)[K], i64 t) {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = load_vec<T, VEC>(x + (start(t) + 32 * k + lane) * VEC);
    };
    i64 t = (i64)blockIdx.x * WARPS + warp;
    Vec<T, VEC> v[K];
    if (F::PREFETCH && t < tiles) load_tile(v, t);
    for (; t < tiles; t += stride) {
        const i64 u0 = start(t);
        if (!F::PREFETCH) load_tile(v, t);
        u32 w[K][W];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            Acc acc;
            acc.add_vec(v[k]);
            acc.pack(w[k]);
        }
        int first = 0;
        reduce_steps<Acc, W, K, UPG / 2, K>(w, lane, first);
        const i64 g0 = u0 / UPG;
        bool careful = false;
        __syncwarp();   // the last tile's units have read their Params
        if ((lane & DUPLICATES) == 0) {
#pragma unroll
            for (int i = 0; i < NF; ++i) {
                const int j = (first + i) * GPS + lane / UPG;
                float lo, hi;
                Acc::unpack(w[i], lo, hi);
                const Params p = F::template prepare<T>(lo, hi, a);
                prm_of[warp][j] = p;
                F::template store_params<T>(p, g0 + j, p0, p1, a);
                careful = careful || p.careful;
            }
        }
        careful = warp_careful(careful);
        __syncwarp();
        // PREFETCH: the next tile's units, in flight while this one's are encoded.
        Vec<T, VEC> next[F::PREFETCH ? K : 1];
        if constexpr (F::PREFETCH) {
            if (t + stride < tiles) load_tile(next, t + stride);
        }
        // A loop for each mode, each without the tests of the others.
        F::with_mode(a, [&](const QuantArgs& m) {
            if (!careful) {
                auto held = [&](int k, i64) { return v[k]; };
                if (F::alternate(m)) {
                    emit_tile<F, T, VEC, false, true, K, GPS, true>(mine, u0, m, rbits, q, deq, held);
                } else {
                    emit_tile<F, T, VEC, false, false, K, GPS, true>(mine, u0, m, rbits, q, deq, held);
                }
            } else {
                auto again = [&](int, i64 u) { return load_vec<T, VEC>(x + u * VEC); };
                if (F::alternate(m)) {
                    emit_tile<F, T, VEC, true, true, K, GPS, false>(mine, u0, m, rbits, q, deq, again);
                } else {
                    emit_tile<F, T, VEC, true, false, K, GPS, false>(mine, u0, m, rbits, q, deq, again);
                }
            }
        });
        if constexpr (F::PREFETCH) {
#pragma unroll
            for (int k = 0; k < K; ++k) v[k] = next[k];
        }
    }
}

// ---------------------------------------------------------------------------------------

}  // namespace cq
