// quantize_groups_staged: the quantizer fed through shared-memory stages.
#pragma once
#include "groups/quantize.cuh"
#include "groups/ring.cuh"

namespace cq {

// The quantizer fed through shared-memory stages (staged.cuh), on the fast path: chunk c
// is groups [c * gpc, (c + 1) * gpc), one run of bytes. Two ways to consume a stage:
//
// ITER == 0: teams of TEAM consumer threads own a group at a time, each thread UPT units
//   of it read from the stage into registers, from its statistics to its codes.
// ITER > 0, for small groups (G = TEAM * UPT units): two passes over the stage. A thread
//   holding a group's units throughout handles 8 * UPT elements of it: with UPT = 4, a
//   group's statistics, parameters and bookkeeping were as many instructions as its codes.
//   Here a warp takes GPW = (32 / TEAM) * ITER groups at a time: teams of TEAM threads
//   reduce them, ITER groups a team, then each lane prepares one group's parameters, and
//   the warp reads the units again from the stage, lane after lane, and writes their codes.
template <class F, typename T, int TEAM, int UPT, int ITER>
__global__ void __launch_bounds__(ST_THREADS, 2)
quantize_groups_staged(const T* __restrict__ x, u8* __restrict__ q, void* __restrict__ p0,
                       void* __restrict__ p1, T* __restrict__ deq, const u32* __restrict__ rbits,
                       i64 groups, i64 G, int mode, u32 seed_lo, u32 seed_hi, i64 gpc, int stages,
                       u32 stage_bytes) {
    typedef MinMax<T> Acc;
    typedef typename F::Params Params;
    constexpr int VEC = 16 / sizeof(T);
    const QuantArgs a{groups, G, G, mode, seed_lo, seed_hi};
    auto produce = [&](i64 c, u8* stage, const StageCopy& cp) {
        const i64 g0 = c * gpc, g1 = g0 + gpc < groups ? g0 + gpc : groups;
        stage_run(x, g0 * G, g1 * G, stage, cp);
    };
    // The groups of chunk c: at most a stage's, so an int.
    auto chunk_groups = [&](i64 c) { return (int)(groups - c * gpc < gpc ? groups - c * gpc : gpc); };
    const i64 chunks = (groups + gpc - 1) / gpc;

    if constexpr (ITER == 0) {
        constexpr int TEAMS = ST_CONSUMERS / TEAM;
        __shared__ u32 scratch[Acc::WORDS * ST_CONSUMER_WARPS];
        const int team = threadIdx.x / TEAM, lane = threadIdx.x % TEAM;
        run_staged(chunks, stages, stage_bytes, 0u, produce, [&](i64 c, u8* stage) {
            const i64 g0 = c * gpc;
            const int n = chunk_groups(c);
            for (int b = 0; b < n; b += TEAMS) {
                const int gi = b + team;
                const i64 off = (g0 + gi) * G;
                const int len = gi < n ? (int)G : 0;
                const T* gx = reinterpret_cast<const T*>(stage) + gi * G;
                Vec<T, VEC> buf[UPT];
#pragma unroll
                for (int j = 0; j < UPT; ++j) {
                    const int el = (lane + j * TEAM) * VEC;
                    if (el < len) buf[j] = load_vec<T, VEC>(gx + el);
                }
                Acc acc[1];
#pragma unroll
                for (int j = 0; j < UPT; ++j)
                    if ((lane + j * TEAM) * VEC < len) acc[0].add_vec(buf[j]);
                Params prm[1];
                finish_stats<F, T, TEAM, 1, true>(acc, prm, a, scratch, 1);
                const bool careful = warp_careful(len > 0 && any_careful(prm));
                if (len > 0 && lane == 0) F::template store_params<T>(prm[0], g0 + gi, p0, p1, a);
#pragma unroll
                for (int j = 0; j < UPT; ++j) {
                    const int el = (lane + j * TEAM) * VEC;
                    if (el < len) emit_unit_any<F, T, VEC, 1>(buf[j], prm, careful, el, off + el, a, rbits, q, deq);
                }
            }
        });
    } else {
        constexpr int UNITS = TEAM * UPT, TPW = 32 / TEAM, GPW = TPW * ITER;
        static_assert(TEAM <= 32 && GPW <= 32, "a warp's groups, one a lane");
        __shared__ float stat_lo[ST_CONSUMER_WARPS][GPW], stat_hi[ST_CONSUMER_WARPS][GPW];
        __shared__ Params prm_of[ST_CONSUMER_WARPS][GPW];
        const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31, team = wl / TEAM, lane = wl % TEAM;
        // In the first pass lane `lane` of a team reads unit (lane + j * TEAM + rot) % UNITS
        // of its group. Teams whose groups lie a multiple of 128 bytes apart would read the
        // same banks in one shared-memory phase (eight lanes, 16 bytes each): four ways at
        // 4 and 8 units, two at 2 and 16. The rotation gives the eight lanes of a phase
        // eight different 16-byte slots. At 16 units, where the conflicts are two ways, the
        // rotation measured no faster, so groups of more than 8 units keep the plain order.
        constexpr int TPP = TEAM >= 8 ? 1 : 8 / TEAM;   // teams in a phase
        const int rot = UNITS > 8 ? 0 : UNITS == 8 ? TEAM * (team % TPP) : (team % TPP) * UNITS / 8;
        run_staged(chunks, stages, stage_bytes, 0u, produce, [&](i64 c, u8* stage) {
            const i64 g0 = c * gpc;
            const int n = chunk_groups(c);
            const T* sx = reinterpret_cast<const T*>(stage);
            for (int b = warp * GPW; b < n; b += ST_CONSUMER_WARPS * GPW) {
#pragma unroll
                for (int i = 0; i < ITER; ++i) {
                    const int gi = b + i * TPW + team;
                    Acc acc;
                    if (gi < n) {
                        Vec<T, VEC> v[UPT];
#pragma unroll
                        for (int j = 0; j < UPT; ++j) v[j] = load_vec<T, VEC>(sx + (i64)gi * (UNITS * VEC) + ((lane + j * TEAM + rot) & (UNITS - 1)) * VEC);
#pragma unroll
                        for (int j = 0; j < UPT; ++j) acc.add_vec(v[j]);
                    }
                    u32 w[Acc::WORDS];
                    acc.pack(w);
                    team_reduce<TEAM, Acc, Acc::WORDS>(w, nullptr);
                    if (lane == 0) {
                        float lo, hi;
                        Acc::unpack(w, lo, hi);
                        stat_lo[warp][i * TPW + team] = lo;
                        stat_hi[warp][i * TPW + team] = hi;
                    }
                }
                __syncwarp();
                const int ng = n - b < GPW ? n - b : GPW;
                bool mine = false;
                if (wl < ng) {
                    const Params p = F::template prepare<T>(stat_lo[warp][wl], stat_hi[warp][wl], a);
                    prm_of[warp][wl] = p;
                    F::template store_params<T>(p, g0 + b + wl, p0, p1, a);
                    mine = p.careful;
                }
                const bool careful = warp_careful(mine);
                __syncwarp();
                // Unit u of the warp's run is element u * VEC of it and belongs to its group
                // u / UNITS; UNITS divides 32, so a lane's units keep their place in a group.
                // (emit takes the element index from the run's start, which starts a group.)
                static_assert(32 % UNITS == 0, "a lane's units keep their place in a group");
                const int units = ng * UNITS;
                const T* wx = sx + (i64)b * (UNITS * VEC);
                const i64 e0 = (g0 + b) * (UNITS * VEC);
                for (int u0 = 0; u0 < units; u0 += 4 * 32) {
                    Vec<T, VEC> v[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int u = u0 + k * 32 + wl;
                        if (u < units) v[k] = load_vec<T, VEC>(wx + u * VEC);
                    }
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int u = u0 + k * 32 + wl;
                        if (u < units) {
                            const Params pr[1] = {prm_of[warp][u0 / UNITS + k * (32 / UNITS) + wl / UNITS]};
                            emit_unit_any<F, T, VEC, 1, true>(v[k], pr, careful, (i64)u * VEC, e0 + (i64)u * VEC, a, rbits, q, deq);
                        }
                    }
                }
                __syncwarp();
            }
        });
    }
}

// ---------------------------------------------------------------------------------------

}  // namespace cq
