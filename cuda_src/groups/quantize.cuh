// quantize_groups: a group (or two) held in registers by a team, or streamed.
#pragma once
#include "groups/units.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// The quantizer.
//
// The tensor is cut into `chunks` chunks of L elements: one group (L = G), or, on the
// general 4-bit path, two groups when G is odd, so that no byte of packed codes straddles
// two chunks. A run of TPG threads (a team) owns a chunk at a time; each thread holds UPT
// units of it, and GPI chunks are loaded before the first is reduced, so GPI * UPT loads
// are in flight per thread. UPT == 0 streams a chunk too long to hold, reading it twice.
// `mode` and the seed words are the format's run-time options.

// Adds a unit whose elements from local index G on belong to the chunk's second group.
template <typename T, int VEC>
__device__ __forceinline__ void add_split(MinMax<T> (&acc)[2], const Vec<T, VEC>& v, i64 el, i64 G) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        if (el + k >= G) acc[1].add(v.v[k]); else acc[0].add(v.v[k]);
    }
}

template <int TPG> struct TeamBlock { enum { value = TPG > 256 ? TPG : 256 }; };

struct QuantArgs {
    i64 chunks, L, G;
    int mode;
    u32 seed_lo, seed_hi;
};

// Encodes one unit whose first element is element `el` of its chunk and `e` of the tensor.
// ALT selects the format's second variant; WHOLE, how the reconstruction is stored
// (store_unit).
template <class F, typename T, int VEC, int NSUB, bool CAREFUL, bool ALT, bool WHOLE = false>
__device__ __forceinline__ void emit_unit(const Vec<T, VEC>& xv, const typename F::Params (&prm)[NSUB],
                                          const u32 (&rnd)[VEC], i64 el, i64 e, const QuantArgs& a,
                                          u8* q, T* deq) {
    u32 r[VEC];
    float d[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        if (NSUB == 2 && el + k >= a.G) {
            r[k] = F::template encode<CAREFUL, ALT, T>(to_f32(xv.v[k]), prm[NSUB - 1], rnd[k], d[k]);
        } else {
            r[k] = F::template encode<CAREFUL, ALT, T>(to_f32(xv.v[k]), prm[0], rnd[k], d[k]);
        }
    }
    store_codes<F::BITS, F::LOW_FIRST, VEC>(q, e - el, el, r);
    if constexpr (F::DEQUANT) store_unit<T, VEC, WHOLE>(deq + e, convert_vec<T, VEC>(d));
}

template <class P, int N> struct ParamsOf { P p[N]; };

// Units of groups whose arithmetic may meet NaN or needs the slow division: rare, so one
// out-of-line copy serves every call site.
template <class F, typename T, int VEC, int NSUB>
__device__ __noinline__ void emit_unit_careful(Vec<T, VEC> xv, ParamsOf<typename F::Params, NSUB> prm,
                                               i64 el, i64 e, QuantArgs a, const u32* rbits, u8* q,
                                               T* deq) {
    u32 rnd[VEC];
    F::template random<VEC>(rnd, e, a, rbits);
    if (F::alternate(a)) {
        emit_unit<F, T, VEC, NSUB, true, true>(xv, prm.p, rnd, el, e, a, q, deq);
    } else {
        emit_unit<F, T, VEC, NSUB, true, false>(xv, prm.p, rnd, el, e, a, q, deq);
    }
}

template <class P, int NSUB>
__device__ __forceinline__ bool any_careful(const P (&prm)[NSUB]) {
    return NSUB == 2 ? prm[0].careful || prm[NSUB - 1].careful : prm[0].careful;
}

// Whether any lane of the warp needs the careful arithmetic; every lane of the warp must
// call it. Its answer, the same in every lane, is what the quantizers branch on: a branch
// that split a warp, with an out-of-line call on one side, would let the call overwrite
// uniform registers (one a warp) that the other side's lanes still read, and compilers
// have built such code (benchmarks/sass_audit.py finds it). The careful arithmetic gives every group its bits, so the
// other units of such a warp take it too.
__device__ __forceinline__ bool warp_careful(bool mine) { return __any_sync(0xffffffffu, mine); }

// One unit; `careful` comes from warp_careful.
template <class F, typename T, int VEC, int NSUB, bool WHOLE = false>
__device__ __forceinline__ void emit_unit_any(const Vec<T, VEC>& xv, const typename F::Params (&prm)[NSUB],
                                              bool careful, i64 el, i64 e, const QuantArgs& a,
                                              const u32* rbits, u8* q, T* deq) {
    if (careful) {
        ParamsOf<typename F::Params, NSUB> pp;
#pragma unroll
        for (int s = 0; s < NSUB; ++s) pp.p[s] = prm[s];
        emit_unit_careful<F, T, VEC, NSUB>(xv, pp, el, e, a, rbits, q, deq);
        return;
    }
    u32 rnd[VEC];
    F::template random<VEC>(rnd, e, a, rbits);
    if (F::alternate(a)) {
        emit_unit<F, T, VEC, NSUB, false, true, WHOLE>(xv, prm, rnd, el, e, a, q, deq);
    } else {
        emit_unit<F, T, VEC, NSUB, false, false, WHOLE>(xv, prm, rnd, el, e, a, q, deq);
    }
}

// Reduces the accumulators of a team and prepares the parameters of its groups.
// A chunk of one group copies its parameters to the second slot, which then stays unused.
template <class F, typename T, int TPG, int NSUB, bool STAGED = false>
__device__ __forceinline__ void finish_stats(const MinMax<T> (&acc)[NSUB], typename F::Params (&prm)[NSUB],
                                             const QuantArgs& a, u32* scratch, i64 groups_per_chunk) {
    typedef MinMax<T> Acc;
    u32 w[Acc::WORDS * NSUB];
#pragma unroll
    for (int s = 0; s < NSUB; ++s) acc[s].pack(w + s * Acc::WORDS);
    team_reduce<TPG, Acc, Acc::WORDS * NSUB, STAGED>(w, scratch);
#pragma unroll
    for (int s = 0; s < NSUB; ++s) {
        float lo, hi;
        Acc::unpack(w + s * Acc::WORDS, lo, hi);
        prm[s] = F::template prepare<T>(lo, hi, a);
    }
    if constexpr (NSUB == 2) {
        if (groups_per_chunk == 1) prm[1] = prm[0];
    }
}

template <class F, typename T, int VEC, int TPG, int UPT, int GPI>
__global__ void __launch_bounds__(TeamBlock<TPG>::value)
quantize_groups(const T* __restrict__ x, u8* __restrict__ q, void* __restrict__ p0,
                void* __restrict__ p1, T* __restrict__ deq, const u32* __restrict__ rbits,
                i64 chunks, i64 L, i64 G, int mode, u32 seed_lo, u32 seed_hi) {
    typedef MinMax<T> Acc;
    typedef typename F::Params Params;
    constexpr int THREADS = TeamBlock<TPG>::value, SLOTS = THREADS / TPG;
    constexpr int NSUB = VEC == 2 ? 2 : 1;   // the general 4-bit path may pair odd groups
    __shared__ u32 scratch[Acc::WORDS * NSUB * (THREADS / 32)];
    const QuantArgs a{chunks, L, G, mode, seed_lo, seed_hi};
    const int lane = threadIdx.x % TPG, slot = threadIdx.x / TPG;
    const i64 groups_per_chunk = L / G;

    for (i64 base = (i64)blockIdx.x * SLOTS * GPI; base < chunks; base += (i64)gridDim.x * SLOTS * GPI) {
        if constexpr (UPT == 0) {
            constexpr int U = 4;
            const i64 cid = base + slot;
            const i64 len = cid < chunks ? L : 0;
            const i64 off = cid * L;
            Acc acc[NSUB];
            auto load = [&](i64 el) { return load_unit<T, VEC>(x + off + el); };
            for_each_streamed<U, TPG, VEC>(len, lane, load, [&](const Vec<T, VEC>& v, i64 el) {
                if constexpr (NSUB == 1) {
                    acc[0].add_vec(v);
                } else {
                    add_split(acc, v, el, G);
                }
            });
            Params prm[NSUB];
            finish_stats<F, T, TPG, NSUB>(acc, prm, a, scratch, groups_per_chunk);
            const bool careful = warp_careful(len > 0 && any_careful(prm));
            if (len > 0 && lane == 0) {
#pragma unroll
                for (int s = 0; s < NSUB; ++s)
                    if (s < groups_per_chunk) F::template store_params<T>(prm[s], cid * groups_per_chunk + s, p0, p1, a);
            }
            for_each_streamed<U, TPG, VEC>(len, lane, load, [&](const Vec<T, VEC>& v, i64 el) {
                emit_unit_any<F, T, VEC, NSUB>(v, prm, careful, el, off + el, a, rbits, q, deq);
            });
        } else {
            Vec<T, VEC> buf[GPI][UPT];
            i64 off[GPI], len[GPI];
#pragma unroll
            for (int u = 0; u < GPI; ++u) {
                const i64 cid = base + (i64)u * SLOTS + slot;
                len[u] = cid < chunks ? L : 0;
                off[u] = cid * L;
#pragma unroll
                for (int j = 0; j < UPT; ++j) {
                    const i64 el = (i64)(lane + j * TPG) * VEC;
                    if (el < len[u]) buf[u][j] = load_unit<T, VEC>(x + off[u] + el);
                }
            }
#pragma unroll
            for (int u = 0; u < GPI; ++u) {
                Acc acc[NSUB];
#pragma unroll
                for (int j = 0; j < UPT; ++j) {
                    const i64 el = (i64)(lane + j * TPG) * VEC;
                    if (el < len[u]) {
                        if constexpr (NSUB == 1) {
                            acc[0].add_vec(buf[u][j]);
                        } else {
                            add_split(acc, buf[u][j], el, G);
                        }
                    }
                }
                Params prm[NSUB];
                finish_stats<F, T, TPG, NSUB>(acc, prm, a, scratch, groups_per_chunk);
                const bool careful = warp_careful(len[u] > 0 && any_careful(prm));
                const i64 cid = base + (i64)u * SLOTS + slot;
                if (len[u] > 0 && lane == 0) {
#pragma unroll
                    for (int s = 0; s < NSUB; ++s)
                        if (s < groups_per_chunk) F::template store_params<T>(prm[s], cid * groups_per_chunk + s, p0, p1, a);
                }
#pragma unroll
                for (int j = 0; j < UPT; ++j) {
                    const i64 el = (i64)(lane + j * TPG) * VEC;
                    if (el < len[u]) emit_unit_any<F, T, VEC, NSUB>(buf[u][j], prm, careful, el, off[u] + el, a, rbits, q, deq);
                }
            }
        }
    }
}

}  // namespace cq
