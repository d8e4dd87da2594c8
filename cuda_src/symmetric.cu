// Symmetric scaled quantization (INT8 and FP8 e4m3, docs/formats.md sections 3 and 4) and its inverse.
//
// Kernels, each a template over the input type Tin, the code (CodeInt8 / CodeE4M3), and the
// vector width VEC (16 bytes of input per access, or 1 where rows are not 16-byte aligned):
//   quantize_row_groups  groups of G contiguous elements of each row (per channel, per row,
//                        per block, per token group, SmoothQuant)
//   smooth_quant_rows    SmoothQuant rows with smooth and 1 / smooth in shared memory
//   quantize_tensor      one scale for the whole tensor, one launch: amax, grid handshake,
//                        then quantize, keeping the first CACHE vectors per thread on chip
//   quantize_static      a given scale
//   quantize_tiles       128x128 tiles (DeepSeek-V3 weight blocks)
//   dequantize_scaled    codes times the scale of their tensor / row / group / tile
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
// Measured on an H200 (benchmarks/NOTES.md): a 7168-element row 0.90 of copy with 256
// threads x 4 blocks, 0.96 with 224 x 5. At 48 registers the kernels spill and lose, and
// keeping more blocks resident beats prefetching the next group into registers, shared
// memory or L2.
template <int TPG, int VPT, bool SMOOTH> struct RowGroupShape {
    enum {
        threads = TPG >= 256 || 256 % TPG != 0 ? TPG : 256,
        fit = 65536 / (threads * (SMOOTH ? 80 : 56)),
        min_blocks = fit > 0 ? fit : 1
    };
};

// ---------------------------------------------------------------------------------------
// Row groups. The input is [rows, K]; each row is cut into groups of G elements (the last
// may be shorter). A run of TPG threads owns one group, each thread VPT vectors of it,
// held in registers; the grid covers the groups once (a grid-stride loop covers the rest
// of very large inputs). VPT == 0 streams groups too long to hold (two reads). SMOOTH
// divides x by smooth[k] first (G must then be K). TS is the scale's stored type: a 16-bit
// TS rounds each scale to it (nearest even) and the codes are computed against the scale
// as stored, so that a reader multiplying by it gets exactly the dequantized values.
template <typename Tin, typename Code, int RULE, int VEC, int TPG, int VPT, bool SMOOTH, typename TS = float>
__global__ void __launch_bounds__(RowGroupShape<TPG, VPT, SMOOTH>::threads,
                                  RowGroupShape<TPG, VPT, SMOOTH>::min_blocks)
quantize_row_groups(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                    TS* __restrict__ scale, const float* __restrict__ smooth,
                    i64 rows, i64 K, i64 G, i64 groups_per_row, u32 gpr_magic, u32 gpr_shift,
                    i64 scale_row_stride, i64 scale_group_stride, i64 scale_pad_rows,
                    float inv_qmax, float eps) {
    typedef typename Code::T CodeT;
    typedef typename Conditional<SMOOTH, float, Tin>::type Tv;   // what is quantized
    constexpr int THREADS = RowGroupShape<TPG, VPT, SMOOTH>::threads, SLOTS = THREADS / TPG;
    constexpr int NV = VPT > 0 ? VPT : 1;
    __shared__ u32 scratch[THREADS / 32];
    const int lane = threadIdx.x % TPG, slot = threadIdx.x / TPG;
    const FastDiv gdiv{groups_per_row, gpr_magic, gpr_shift};
    const i64 total = rows * groups_per_row;
    const u32 eps_bits = f2u(eps);

    for (i64 base = (i64)blockIdx.x * SLOTS; base < total; base += (i64)gridDim.x * SLOTS) {
        const i64 gid = base + slot;
        const bool live = gid < total;
        const i64 r = live ? gdiv.div(gid) : 0;
        const i64 g = gid - r * groups_per_row;
        const i64 start = g * G;
        const Tin* xg = x + (r * K + start);
        CodeT* qg = q + (r * K + start);
        const i64 len = live ? (K - start < G ? K - start : G) : 0;
        auto stream_load = [&](i64 e) { return load_group_vec<Tin, VEC, SMOOTH>(xg + e, smooth + e); };

        u32 amax;
        Vec<Tv, VEC> val[NV];
        if constexpr (VPT > 0) {
            // A held group is at most 65536 elements: 32-bit offsets within it.
            const int hlen = (int)len;
            Vec<Tin, VEC> raw[NV];
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int e = (lane + j * TPG) * VEC;
                if (e < hlen) raw[j] = load_vec<Tin, VEC>(xg + e);
            }
            AbsMax<Tv> acc;
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int e = (lane + j * TPG) * VEC;
                if (e < hlen) {
                    if constexpr (SMOOTH) {
                        val[j] = smooth_vec<Tin, VEC>(raw[j], load_vec<float, VEC>(smooth + e).v);
                    } else {
                        val[j] = raw[j];
                    }
                    acc.add(val[j]);
                }
            }
            amax = group_max<TPG>(acc.bits(), scratch);
        } else {
            // Streamed: the group is read twice (the second read mostly hits L2).
            AbsMax<Tv> acc;
            for_each_streamed<4, TPG, VEC>(len, lane, stream_load,
                                           [&](const Vec<Tv, VEC>& v, i64) { acc.add(v); });
            amax = group_max<TPG>(acc.bits(), scratch);
        }

        constexpr bool ROUNDED = !IsSame<TS, float>::value;
        const float s = to_f32(from_f32<TS>(scale_from_amax<RULE>(amax, inv_qmax, eps_bits)));
        if (len > 0 && lane == 0) {
            const i64 sidx = r * scale_row_stride + g * scale_group_stride;
            scale[sidx] = from_f32<TS>(s);
            if (r == rows - 1) {  // the column layout's padding rows
#pragma unroll 1
                for (i64 p = 1; p <= scale_pad_rows; ++p) scale[sidx + p * scale_row_stride] = from_f32<TS>(0.0f);
            }
        }
        const DivPlan plan = plan_division(s);
        const int path = div_path<RULE>(plan, amax, eps_bits);
        if constexpr (VPT > 0) {
            store_held_codes<Tv, Code, RULE, VEC, TPG, NV, ROUNDED>(qg, val, (int)len, lane, plan, path);
        } else {
            on_path(path, [&](auto tag) {
                constexpr int P = decltype(tag)::value, CORR = FastCorrections<Tv, RULE>::value;
                for_each_streamed<4, TPG, VEC>(len, lane, stream_load, [&](const Vec<Tv, VEC>& v, i64 e) {
                    store_code_vec<Code, VEC>(qg + e, quantize_vec_on<P, CORR, Tv, Code, VEC, ROUNDED>(v, plan));
                });
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// SmoothQuant rows held on chip (INT8): xs = x / smooth, then one scale per row.
//
// A persistent grid. Each block first puts -smooth[k] and y[k] = RN(1 / smooth[k]) in shared
// memory (y NaN where |smooth[k]| is outside [2**-32, 2**32]), so that x / smooth costs a
// multiply and one Newton correction (two for float32 x), without the reciprocal, range
// check and branch of a div.rn (divide_by_reciprocal: exact while |x| >= 2**-100 and
// 2**-125 <= |xs| <= 2**100). Read from L1 instead, smooth missed there often enough to
// cost a quarter of the speed (benchmarks/NOTES.md).
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
// one block where the teams are whole warps (two blocks of 256 built the tables twice; on
// an H200, bf16 16384 x 7168 went from 0.918 to 0.927 of copy as one), two of 256 for
// teams of 32 (0.013 lower as one at 32768 x 1792). Four vectors fit 80 registers, three
// blocks of 256 (one of 768 lost 0.07 at 4096 x 7168; benchmarks/NOTES.md, twenty-sixth
// round).
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
// On an H200 (bf16 16384 x 7168, two blocks of 256) that took 0.890 to 0.918 of copy, and
// rows that divide again (NaN, inf, tiny, huge) no longer hold their team back (0.849 ->
// 0.920); with 4 vectors a thread, or rows not full, it lost 0.01-0.10 (benchmarks/NOTES.md,
// twenty-fifth and twenty-sixth rounds).
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

// ---------------------------------------------------------------------------------------
// One scale for the whole tensor (n elements, any shape), in one launch. The grid must be
// co-resident (the host sizes it from the occupancy), ws is a zeroed 3-word workspace that
// the kernel leaves zeroed. Each thread keeps its first CACHE vectors in registers; the
// rest are read again in phase 2, newest first so that what is still in L2 is used.
template <typename Tin, typename Code, int VEC, int CACHE>
__global__ void __launch_bounds__(256, 4)
quantize_tensor(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                float* __restrict__ scale_out, i64 n, u32* __restrict__ ws, float inv_qmax) {
    constexpr int THREADS = 256, UNROLL = 4;
    __shared__ u32 scratch[THREADS / 32 + 1];
    const i64 nvec = n / VEC, tail = n - nvec * VEC;
    const i64 ntiles = (nvec + THREADS - 1) / THREADS;
    const i64 G = gridDim.x, tid = threadIdx.x;

    Vec<Tin, VEC> cache[CACHE];
    AbsMax<Tin> acc;
#pragma unroll
    for (int j = 0; j < CACHE; ++j) {
        const i64 v = ((i64)blockIdx.x + j * G) * THREADS + tid;
        if (v < nvec) cache[j] = load_vec<Tin, VEC>(x + v * VEC);
    }
#pragma unroll
    for (int j = 0; j < CACHE; ++j)
        if (((i64)blockIdx.x + j * G) * THREADS + tid < nvec) acc.add(cache[j]);
    const i64 first = (i64)blockIdx.x + CACHE * G;
    for (i64 t = first; t < ntiles; t += UNROLL * G) {
        Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = (t + k * G) * THREADS + tid;
            if (v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k)
            if ((t + k * G) * THREADS + tid < nvec) acc.add(tmp[k]);
    }
    if (blockIdx.x == 0 && tid < tail) acc.add(load_vec<Tin, 1>(x + nvec * VEC + tid));

    u32 amax = group_max<THREADS>(acc.bits(), scratch);
    amax = grid_max(amax, ws, &scratch[THREADS / 32]);
    const float s = scale_from_amax<ZERO_IS_ONE>(amax, inv_qmax, 0u);
    if (blockIdx.x == 0 && tid == 0) scale_out[0] = s;
    const DivPlan p = plan_division(s);
    on_path(div_path<ZERO_IS_ONE>(p, amax, 0u), [&](auto path) {
        constexpr int P = decltype(path)::value, CORR = FastCorrections<Tin, ZERO_IS_ONE>::value;
        if (first < ntiles) {
            const i64 last = first + ((ntiles - 1 - first) / G) * G;
            for (i64 t = last; t >= first; t -= UNROLL * G) {
                Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
                for (int k = 0; k < UNROLL; ++k) {
                    const i64 tt = t - k * G, v = tt * THREADS + tid;
                    if (tt >= first && v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
                }
#pragma unroll
                for (int k = 0; k < UNROLL; ++k) {
                    const i64 tt = t - k * G, v = tt * THREADS + tid;
                    if (tt >= first && v < nvec)
                        store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_on<P, CORR, Tin, Code, VEC>(tmp[k], p));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < CACHE; ++j) {
            const i64 v = ((i64)blockIdx.x + j * G) * THREADS + tid;
            if (v < nvec) store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_on<P, CORR, Tin, Code, VEC>(cache[j], p));
        }
        if (blockIdx.x == 0 && tid < tail) {
            const i64 i = nvec * VEC + tid;
            store_code_vec<Code, 1>(q + i, quantize_vec_on<P, CORR, Tin, Code, 1>(load_vec<Tin, 1>(x + i), p));
        }
    });
}

// ---------------------------------------------------------------------------------------
// A given scale: *scale_ptr when scale_ptr is set, else scale_value (then also written to
// scale_out[0]). Any dividend may meet any divisor here, so the division is div.rn, except
// for int8 vectors that int8_static_bound admits. Each block takes a contiguous chunk of
// UNROLL * 256 vectors at a time.

// For int8 and a divisor b with 2**-60 <= |b| < 2**126 (a plan neither exact nor
// prescaled): the bits of the largest finite magnitude of Tin at most 2**100 |b| (both
// roundings toward zero, so never above it). In a vector no larger, every x / b is finite
// and within divide_by_reciprocal's range wherever its code can be nonzero (|x| >= |b| / 2
// >= 2**-61), so the reciprocal and a clamp give the codes, without div.rn or a NaN test.
template <typename Tin>
__device__ __forceinline__ u32 int8_static_bound(float b) {
    float m;
    asm("mul.rz.f32 %0, %1, %2;" : "=f"(m) : "f"(u2f(f2u(b) & 0x7fffffffu)), "f"(0x1p100f));
    if constexpr (IsSame<Tin, float>::value) {
        return f2u(m);
    } else if constexpr (IsSame<Tin, bfloat16>::value) {
        return f2u(m) >> 16;
    } else {
        u16 h;
        asm("cvt.rz.f16.f32 %0, %1;" : "=h"(h) : "f"(m));
        return h;
    }
}

// Whether every |x| of a vector is at most the magnitude with bits `bound` (NaN is not).
template <typename Tin, int VEC>
__device__ __forceinline__ bool within_bound(const Vec<Tin, VEC>& x, u32 bound) {
    AbsMax<Tin> m;
    m.add(x);
    if constexpr (sizeof(Tin) == 2) {
        const u32 both = bound * 0x10001u;
        return max_u16x2(m.acc, both) == both;
    } else {
        return m.acc <= bound;
    }
}

template <typename Tin, typename Code, int VEC>
__global__ void __launch_bounds__(256)
quantize_static(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                const float* __restrict__ scale_ptr, float scale_value,
                float* __restrict__ scale_out, i64 n) {
    constexpr int THREADS = 256, UNROLL = 4, CHUNK = THREADS * UNROLL;
    // One correction is exact for 16-bit dividends and any divisor (common.cuh).
    constexpr int CORR = sizeof(Tin) == 2 ? 1 : 2;
    constexpr bool INT8 = IsSame<Code, CodeInt8>::value && VEC > 1;
    const float b = scale_ptr ? *scale_ptr : scale_value;
    if (scale_out && blockIdx.x == 0 && threadIdx.x == 0) scale_out[0] = b;
    const DivPlan plan = plan_division(b);
    // 0: no vector takes the fast path. A bound is finite, so NaN never passes it.
    const u32 bound = INT8 && !plan.exact && !plan.scaled ? int8_static_bound<Tin>(b) : 0u;
    const i64 nvec = n / VEC, tail = n - nvec * VEC;
    for (i64 c = (i64)blockIdx.x * CHUNK; c < nvec; c += (i64)gridDim.x * CHUNK) {
        Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c + k * THREADS + threadIdx.x;
            if (v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c + k * THREADS + threadIdx.x;
            if (v >= nvec) continue;
            if (INT8 && bound && within_bound(tmp[k], bound)) {
                store_code_vec<Code, VEC>(q + v * VEC,
                                          quantize_vec_fast<Tin, Code, VEC, false, CORR, INT8>(tmp[k], plan));
            } else {
                store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_div<Tin, Code, VEC>(tmp[k], b));
            }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < tail) {
        const i64 i = nvec * VEC + threadIdx.x;
        store_code_vec<Code, 1>(q + i, quantize_vec_div<Tin, Code, 1>(load_vec<Tin, 1>(x + i), b));
    }
}

// ---------------------------------------------------------------------------------------
// 128x128 tiles of an [N, K] matrix, edge tiles partial; one block of 256 threads owns a
// tile, held in registers (64 elements a thread), four blocks per multiprocessor; the grid
// covers the tiles once. scale is [tiles_n, tiles_k] row-major. RULE: ZERO_IS_ONE (float32
// scales) or ZERO_IS_ONE_POW2 (UE8M0 scales, the codes against the rounded scale).
template <typename Tin, typename Code, int VEC, int RULE = ZERO_IS_ONE>
__global__ void __launch_bounds__(256, 4)
quantize_tiles(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
               float* __restrict__ scale, i64 N, i64 K, i64 tiles_n, i64 tiles_k, float inv_qmax) {
    constexpr int THREADS = 256, TILE = 128, COLV = TILE / VEC, RPP = THREADS / COLV,
                  PASSES = TILE / RPP;
    __shared__ u32 scratch[THREADS / 32];
    const int cv = threadIdx.x % COLV, r0 = threadIdx.x / COLV;
    for (i64 t = blockIdx.x; t < tiles_n * tiles_k; t += gridDim.x) {
        const i64 tn = t / tiles_k, tk = t - tn * tiles_k;
        const i64 col = tk * TILE + (i64)cv * VEC;
        const bool col_ok = col < K;
        const i64 off = (tn * TILE + r0) * K + col;
        const i64 rows_left = N - tn * TILE - r0;
        Vec<Tin, VEC> buf[PASSES];
#pragma unroll
        for (int p = 0; p < PASSES; ++p)
            if (col_ok && p * RPP < rows_left) buf[p] = load_vec<Tin, VEC>(x + off + (i64)p * RPP * K);
        AbsMax<Tin> acc;
#pragma unroll
        for (int p = 0; p < PASSES; ++p)
            if (col_ok && p * RPP < rows_left) acc.add(buf[p]);
        const u32 amax = group_max<THREADS>(acc.bits(), scratch);
        const float s = scale_from_amax<RULE>(amax, inv_qmax, 0u);
        if (threadIdx.x == 0) scale[t] = s;
        const DivPlan plan = plan_division(s);
        on_path(div_path<RULE>(plan, amax, 0u), [&](auto path) {
            constexpr int P = decltype(path)::value, CORR = FastCorrections<Tin, RULE>::value;
#pragma unroll
            for (int p = 0; p < PASSES; ++p)
                if (col_ok && p * RPP < rows_left)
                    store_code_vec<Code, VEC>(q + off + (i64)p * RPP * K,
                                          quantize_vec_on<P, CORR, Tin, Code, VEC>(buf[p], plan));
        });
    }
}

// ---------------------------------------------------------------------------------------
// Dequantization of an [rows, K] code matrix (K % VEC == 0). MODE says where an element's
// scale is: TENSOR scale[0]; ROW scale[r * srs]; GROUP scale[r * srs + (c >> shift) * scs];
// TILE scale[(r >> 7) * srs + (c >> 7) * scs]. x = Tout(f32(code) * scale), the product
// rounded once to float32.
enum ScaleMode { PER_TENSOR = 0, PER_ROW = 1, PER_GROUP = 2, PER_TILE = 3 };

// UNROLL vectors are in flight per thread, a grid apart. Measured on an H200
// (benchmarks/NOTES.md): 2 beats 4 and 8 for every mode, 1 is best for one scale.
template <typename Code, typename Tout, int VEC, int MODE, int UNROLL>
__global__ void __launch_bounds__(256)
dequantize_scaled(const typename Code::T* __restrict__ q, const float* __restrict__ scale,
                  Tout* __restrict__ out, i64 rows, i64 kv, u32 kv_magic, u32 kv_shift,
                  i64 col_shift, i64 srs, i64 scs) {
    typedef typename Code::T CodeT;
    constexpr int THREADS = 256, CHUNK = THREADS * UNROLL;
    const FastDiv kd{kv, kv_magic, kv_shift};
    const i64 nvec = rows * kv;
    const float s0 = MODE == PER_TENSOR ? scale[0] : 0.0f;
    const i64 step = (i64)gridDim.x * THREADS;
    const i64 first = (i64)blockIdx.x * THREADS + threadIdx.x;
    for (i64 c0 = first; c0 < nvec; c0 += (i64)gridDim.x * CHUNK) {
        Vec<CodeT, VEC> codes[UNROLL];
        float s[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c0 + k * step;
            if (v < nvec) {
                if constexpr (IsSame<Code, CodeInt8>::value) {
                    codes[k] = load_stream<CodeT, VEC>(q + v * VEC);  // the scales stay in L1
                } else {
                    codes[k] = load_vec<CodeT, VEC>(q + v * VEC);
                }
                if constexpr (MODE == PER_TENSOR) {
                    s[k] = s0;
                } else {
                    const i64 r = kd.div(v);
                    if constexpr (MODE == PER_ROW) {
                        s[k] = scale[r * srs];
                    } else {
                        const i64 c = (v - r * kv) * VEC;
                        s[k] = MODE == PER_GROUP ? scale[r * srs + (c >> col_shift) * scs]
                                                 : scale[(r >> 7) * srs + (c >> 7) * scs];
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c0 + k * step;
            if (v < nvec) {
                float f[VEC];
                decode_vec<Code, VEC>(codes[k], f);
#pragma unroll
                for (int i = 0; i < VEC; ++i) f[i] = mul_rn(f[i], s[k]);
                store_vec<Tout, VEC>(out + v * VEC, convert_vec<Tout, VEC>(f));
            }
        }
    }
}

}  // namespace cq
