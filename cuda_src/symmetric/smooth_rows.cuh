// smooth_quant_rows: SmoothQuant rows with smooth and 1 / smooth in shared memory.
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"
#include "symmetric/row_groups.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// SmoothQuant rows held on chip (INT8): xs = x / smooth, then one scale per row.
//
// A persistent grid. Each block first puts -smooth[k] and y[k] = RN(1 / smooth[k]) in shared
// memory (y NaN where |smooth[k]| is outside [2**-32, 2**32]), so that x / smooth costs a
// multiply and one Newton correction (two for float32 x), without the reciprocal, range
// check and branch of a div.rn (divide_by_reciprocal: exact while |x| >= 2**-100 and
// 2**-125 <= |xs| <= 2**100). Read from L1 instead, smooth missed there often enough to
// cost much of the speed.
// With smooth in range, every quotient of magnitude >= 2**-68 meets that, and every smaller
// one comes out below 2**-67. So a row is exact as computed when its amax lies in
// [2**-20, 2**99]: the amax is then an exact quotient and an inexact one is below 2**-40 of
// the scale, code 0 either way. An all-zero row is exact too (int8 codes carry no sign of
// zero). Any other row (NaN, inf, huge or tiny quotients, a smooth out of range) is divided
// again by div.rn.
constexpr u32 SMOOTH_LO = 0x2f800000u, SMOOTH_HI = 0x4f800000u;      // 2**-32, 2**32
constexpr u32 SMOOTH_AMAX_LO = 0x35800000u, SMOOTH_AMAX_HI = 0x71000000u;  // 2**-20, 2**99

// The largest |v| of float32 values, NaN above inf, from two running maxima of their bits:
// unsigned (any negative value beats every positive one, and among negatives the larger
// magnitude wins) and signed (any positive value beats every negative one). Two three-way
// integer maxima per two values, where masking each value first would cost one more.
struct BitsMax {
    u32 u = 0u;
    int s = (int)0x80000000u;
    __device__ __forceinline__ void add2(float a, float b) {
        u = umax(u, umax(f2u(a), f2u(b)));
        s = max(s, max((int)f2u(a), (int)f2u(b)));
    }
    __device__ __forceinline__ u32 bits() const { return umax(u & 0x7fffffffu, (u32)s & 0x7fffffffu); }
};

template <typename Tin, int VEC>
__device__ __forceinline__ Vec<float, VEC> smooth_vec_fast(const Vec<Tin, VEC>& x, const float* nb,
                                                           const float* y) {
    constexpr int CORR = sizeof(Tin) == 2 ? 1 : 2;
    Vec<float, VEC> r;
    float a[VEC];
    unpack(x, a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) r.v[i] = divide_by_reciprocal<CORR>(a[i], nb[i], y[i]);
    return r;
}

// SmoothQuant's codes rint(RN(xs / s)) for a scale s from the row's own maximum, without
// Newton corrections. y = RN(1 / s) is within 2**-24 of 1 / s relative, so RN(xs / s) is
// within 2**-23 (1 + 2**-23) of the exact product xs * y, and lo and hi, y three units in
// the last place down and up, are at least 3 * 2**-24 from y: RN(xs / s) lies strictly
// between xs * lo and xs * hi (a subnormal RN(xs / s) rounds to 0 with both). fma(xs,
// lo / hi, 1.5 * 2**23) rounds each product to an integer, half to even, a monotone map
// (the low byte is the code): where the two agree, RN(xs / s) rounds to the same. Their
// difference goes into diff (one LOP3 an element); the caller divides again where it is
// nonzero: a quotient within |xs / s| * 2**-21 of a half-integer, rare except on one.
template <int VEC>
__device__ __forceinline__ CodeVec<CodeInt8, VEC> smooth_codes(const Vec<float, VEC>& v, float lo, float hi,
                                                               u32& diff) {
    float m[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        m[i] = fma_rn(v.v[i], hi, RNE_MAGIC);
        diff |= f2u(m[i]) ^ f2u(fma_rn(v.v[i], lo, RNE_MAGIC));
    }
    return int8_codes_of_magic<VEC>(m);
}

// Bits of x's elements or-ed into acc, sign bits included (masked by the caller).
template <typename Tin, int VEC>
__device__ __forceinline__ u32 or_bits(u32 acc, const Vec<Tin, VEC>& x) {
    const u32* w = reinterpret_cast<const u32*>(&x);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(Vec<Tin, VEC>) / 4); ++k) acc |= w[k];
    return acc;
}
template <typename Tin> struct MagnitudeMask { static constexpr u32 value = 0x7fff7fffu; };
template <> struct MagnitudeMask<float> { static constexpr u32 value = 0x7fffffffu; };

// Per-column values in shared memory, laid out so that a warp reading the VEC columns of
// its vectors reads contiguous 16-byte pieces (no bank conflicts): for VEC = 8, the first
// four columns of each vector in one half of the array, the last four in the other.
template <int VEC>
__device__ __forceinline__ int column_slot(int k, int K) {
    if constexpr (VEC == 8) {
        return (k & 4 ? K >> 1 : 0) + ((k >> 3) << 2) + (k & 3);
    } else {
        return k;
    }
}
template <int VEC>
__device__ __forceinline__ Vec<float, VEC> load_columns(const float* base, int e, int K) {
    Vec<float, VEC> r;
    if constexpr (VEC == 8) {
        const Vec<float, 4> lo = *reinterpret_cast<const Vec<float, 4>*>(base + (e >> 1));
        const Vec<float, 4> hi = *reinterpret_cast<const Vec<float, 4>*>(base + (K >> 1) + (e >> 1));
#pragma unroll
        for (int i = 0; i < 4; ++i) r.v[i] = lo.v[i], r.v[4 + i] = hi.v[i];
    } else {
        r = *reinterpret_cast<const Vec<float, VEC>*>(base + e);
    }
    return r;
}

// The tables of smooth_quant_rows: rcp[at] = RN(1 / smooth[k]) (NaN where smooth[k] is out
// of [2**-32, 2**32]) and col[at] = -smooth[k], at = column_slot(k). Read one float at a
// time, smooth's latency made up most of a small call: 16-byte loads, four in flight a
// thread, where smooth is 16-byte aligned (K % 4 == 0 here, and four consecutive columns
// land in one 16-byte piece of each table). Not inlined, so that it leaves the register
// allocation of the row loop alone (inlined, the kernel ran 4% slower at 16384 x 7168).
template <int VEC, int THREADS>
__device__ __noinline__ void smooth_tables(const float* __restrict__ smooth, float* rcp, float* col, int K) {
    auto put = [&](int k, const Vec<float, 4>& b) {
        Vec<float, 4> y, nb;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 mag = f2u(b.v[i]) & 0x7fffffffu;
            y.v[i] = mag >= SMOOTH_LO && mag <= SMOOTH_HI ? rcp_rn(b.v[i]) : u2f(0x7fffffffu);
            nb.v[i] = u2f(f2u(b.v[i]) ^ 0x80000000u);
        }
        const int at = column_slot<VEC>(k, K);
        *reinterpret_cast<Vec<float, 4>*>(rcp + at) = y;
        *reinterpret_cast<Vec<float, 4>*>(col + at) = nb;
    };
    if ((reinterpret_cast<u64>(smooth) & 15u) == 0) {
        const int K4 = K >> 2;
        for (int first = threadIdx.x; first < K4; first += 4 * THREADS) {
            Vec<float, 4> b[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (first + u * THREADS < K4) b[u] = load_vec<float, 4>(smooth + 4 * (first + u * THREADS));
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (first + u * THREADS < K4) put(4 * (first + u * THREADS), b[u]);
        }
    } else {
        for (int k = 4 * threadIdx.x; k < K; k += 4 * THREADS)
            put(k, Vec<float, 4>{{smooth[k], smooth[k + 1], smooth[k + 2], smooth[k + 3]}});
    }
}

// Threads of a smooth_quant_rows block and the blocks a multiprocessor the compiler must
// fit. Teams share a block, and with it the tables. Teams of 5-7 vectors a thread hold up
// to 56 float32 quotients and get 128 registers, so a multiprocessor holds 512 threads:
// one block where the teams are whole warps (two blocks of 256 would build the tables
// twice), two of 256 for teams of 32, which measured faster than one. Four vectors fit 80
// registers, three blocks of 256, also measured faster than one of 768.
template <int TPG, int VPT> struct SmoothShape {
    enum {
        threads = TPG >= 512 ? TPG : TPG == 256 || (VPT > 4 && TPG > 32) ? 512 : 256,
        fit = 65536 / (threads * (VPT > 4 ? 128 : 80)),
        min_blocks = fit > 0 ? fit : 1
    };
};

// Shared memory: the reciprocals and -smooth (K floats each, column_slot order, each
// rounded up to 16 bytes), then one 16-byte slot per thread and vector for the next row,
// copied in the background while this one is worked on. FULL: every row fills every
// vector of every thread (K = TPG * VPT * VEC, teams of whole warps), so no vector is
// tested, and a team whose row is past the end leaves the loop.
//
// Rows are dealt to teams in a fixed order, except in full rows of 5-7 vectors a thread
// and teams of several warps (DYN): there each team's first two rows are fixed and every
// later one comes from a counter, ws[0], so that a team slowed by its rows (or by its
// multiprocessor) takes fewer. The team's leader takes a row from the counter as the row
// before is copied and hands it out at the row's barrier; the last team to finish (ws[1]
// counts them) zeroes both words. ws is the caller's zeroed workspace for this stream.
// Rows that divide again (NaN, inf, tiny, huge) then no longer hold their team back. With
// 4 vectors a thread, or rows not full, the counter measured slower, so those keep the
// fixed order.
template <typename Tin, int VEC, int TPG, int VPT, bool FULL>
__global__ void __launch_bounds__(SmoothShape<TPG, VPT>::threads, SmoothShape<TPG, VPT>::min_blocks)
smooth_quant_rows(const Tin* __restrict__ x, i8* __restrict__ q, float* __restrict__ scale,
                  const float* __restrict__ smooth, i64 rows, int K, float inv_qmax,
                  u32* __restrict__ ws) {
    static_assert(sizeof(Vec<Tin, VEC>) == 16, "rows are copied in 16-byte vectors");
    constexpr int THREADS = SmoothShape<TPG, VPT>::threads, SLOTS = THREADS / TPG, WARPS = THREADS / 32;
    static_assert(THREADS % TPG == 0 && (TPG <= 32 || TPG % 32 == 0), "teams of whole warps or within one");
    extern __shared__ __align__(16) float rcp[];
    // The rows' warp maxima alternate between two areas (one barrier a row: a team writes
    // an area again only after a barrier that every reader of its last use passed); the
    // third is the rare second reduction's.
    __shared__ __align__(16) u32 scratch[3][WARPS];
    int parity = 0;
    const int KP = (K + 3) & ~3;
    float* col = rcp + KP;  // -smooth
    Vec<Tin, VEC>* next = reinterpret_cast<Vec<Tin, VEC>*>(rcp + 2 * KP) + threadIdx.x;
    const u32 next_addr = smem_addr(next);
    const int lane = threadIdx.x % TPG, slot = threadIdx.x / TPG;
    const i64 stride = (i64)gridDim.x * SLOTS;
    // Teams of whole warps meet at a barrier of their own (1 + slot; 0 is __syncthreads), so
    // that no team waits for another; each reads its own warps' words of a scratch area.
    auto team_barrier = [&]() {
        if constexpr (TPG >= THREADS) {
            __syncthreads();
        } else {
            asm volatile("bar.sync %0, %1;" ::"r"(1 + slot), "n"(TPG) : "memory");
        }
    };
    // The maximum of v over this thread's team: shuffles for a team within a warp; for
    // whole warps, each warp's maximum into sc, the team's barrier, the team's words.
    auto team_max = [&](u32 v, u32* sc) {
        if constexpr (TPG <= 32) {
            return lanes_max<TPG>(v);
        } else {
            const u32 wm = __reduce_max_sync(0xffffffffu, v);  // one REDUX for five shuffles
            if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = wm;
            team_barrier();
            u32 m = 0u;
#pragma unroll
            for (int w = 0; w < TPG / 32; ++w) m = umax(m, sc[slot * (TPG / 32) + w]);
            return m;
        }
    };
    // This thread's vectors j < nin lie inside a row, the same for every row.
    static_assert(!FULL || TPG >= 32, "a team leaves the row loop on its own only if it is whole warps");
    int nin = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) nin += (lane + j * TPG) * VEC < K;
    if constexpr (FULL) nin = VPT;

    auto prefetch = [&](i64 r) {
        if (r < rows) {
            const Tin* xr = x + r * K + lane * VEC;
#pragma unroll
            for (int j = 0; j < VPT; ++j)
                if (j < nin) cp_async16(next_addr + j * THREADS * 16, xr + j * TPG * VEC);
        }
        cp_async_commit();
    };
    prefetch((i64)blockIdx.x * SLOTS + slot);

    smooth_tables<VEC, THREADS>(smooth, rcp, col, K);
    __syncthreads();

    // DYN: this team's row r_dyn, the next (n1, being copied) and the one after (n2, from
    // the counter, known at the row's barrier). Each team's rows only grow, so a team
    // that reaches the end has taken no row it leaves undone.
    constexpr bool DYN = FULL && VPT >= 5 && TPG > 32;
    __shared__ i64 next_row[2][SLOTS];
    i64 r_dyn = (i64)blockIdx.x * SLOTS + slot, n1 = r_dyn + stride, n2 = 0;
    u32 taken = 0u;
    for (i64 base = (i64)blockIdx.x * SLOTS; DYN ? r_dyn < rows : base < rows;
         base += stride, r_dyn = n1, n1 = n2) {
        const i64 r = DYN ? r_dyn : base + slot;
        const bool live = r < rows;
        if constexpr (FULL && !DYN) {
            if (!live) break;
        }
        const int held = FULL ? VPT : live ? nin : 0;
        // f(j) for each of this thread's vectors j of the row.
        auto for_held = [&](auto f) {
#pragma unroll
            for (int j = 0; j < VPT; ++j)
                if (j < held) f(j);
        };
        // This thread's vectors of row r, copied by itself (the reads are done before
        // the copy of its next row, issued just after, can land: it waits on global
        // memory).
        cp_async_wait_all();
        Vec<Tin, VEC> raw[VPT];
        for_held([&](int j) { raw[j] = next[j * THREADS]; });
        prefetch(DYN ? n1 : r + stride);
        if (DYN && lane == 0) taken = atomicAdd(&ws[0], 1u);

        Vec<float, VEC> val[VPT];
        BitsMax m;
        u32 any = 0;
        for_held([&](int j) {
            const int e = (lane + j * TPG) * VEC;
            val[j] = smooth_vec_fast<Tin, VEC>(raw[j], load_columns<VEC>(col, e, K).v,
                                               load_columns<VEC>(rcp, e, K).v);
#pragma unroll
            for (int i = 0; i < VEC; i += 2) m.add2(val[j].v[i], val[j].v[i + 1]);
            any = or_bits<Tin, VEC>(any, raw[j]);
        });
        // A thread holding a nonzero x counts at least 1 (a subnormal) towards the
        // maximum: a nonzero row whose quotients all came out 0 is then a tiny row, not
        // a zero one.
        const u32 mine = umax(m.bits(), (any & MagnitudeMask<Tin>::value) != 0);
        auto redo = [](u32 amax) {
            return !(amax <= SMOOTH_AMAX_HI && (amax >= SMOOTH_AMAX_LO || amax == 0));
        };
        // The team's maximum, and whether it must divide again: a decision of the warp
        // where teams share shuffles (teams within a warp).
        if (DYN && lane == 0) next_row[parity][slot] = 2 * stride + taken;
        u32 amax = team_max(mine, scratch[parity]);   // its barrier hands out next_row too
        if (DYN) n2 = next_row[parity][slot];
        parity ^= 1;
        bool again_all = redo(amax);
        if constexpr (TPG <= 32) again_all = __any_sync(0xffffffffu, again_all);
        if (!again_all) {
            // amax in [2**-20, 2**99] or 0: the scale is normal and every quotient is
            // within divide_fast's range (two corrections for float32 dividends).
            const float s = amax == 0u ? 1.0f : mul_rn(u2f(amax), inv_qmax);
            if (live && lane == 0) scale[r] = s;
            DivPlan plan;
            plan.nb = u2f(f2u(s) ^ 0x80000000u);
            plan.y = rcp_rn(s);
            i8* qr = q + r * K + lane * VEC;
            const float lo = u2f(f2u(plan.y) - 3u), hi = u2f(f2u(plan.y) + 3u);
            u32 diff = 0u;
            for_held([&](int j) {
                store_code_vec<CodeInt8, VEC>(qr + j * TPG * VEC, smooth_codes<VEC>(val[j], lo, hi, diff));
            });
            if (diff != 0u) {  // rare: this thread's codes again, divided exactly
                for_held([&](int j) {
                    store_code_vec<CodeInt8, VEC>(
                        qr + j * TPG * VEC, quantize_vec_on<PATH_FAST, 2, float, CodeInt8, VEC>(val[j], plan));
                });
            }
            continue;
        }
        // Rare: divide again by div.rn.
        AbsMax<float> again;
        for_held([&](int j) {
            const int e = (lane + j * TPG) * VEC;
            val[j] = smooth_vec<Tin, VEC>(load_vec<Tin, VEC>(x + r * K + e), load_vec<float, VEC>(smooth + e).v);
            again.add(val[j]);
        });
        if constexpr (TPG > 32) team_barrier();  // the team's last second reduction has read scratch[2]
        amax = team_max(again.bits(), scratch[2]);
        const float s = scale_from_amax<ZERO_IS_ONE>(amax, inv_qmax, 0u);
        if (live && lane == 0) scale[r] = s;
        const DivPlan plan = plan_division(s);
        store_held_codes<float, CodeInt8, ZERO_IS_ONE, VEC, TPG, VPT>(q + r * K, val, live ? K : 0, lane, plan,
                                                                     div_path<ZERO_IS_ONE>(plan, amax, 0u));
    }
    cp_async_wait_all();
    if (DYN && lane == 0) __threadfence();  // its takes from ws[0] before its count in ws[1]
    if (DYN && lane == 0 && atomicAdd(&ws[1], 1u) == (u32)stride - 1u) {  // the last team out
        atomicExch(&ws[0], 0u);
        atomicExch(&ws[1], 0u);
    }
}

}  // namespace cq
