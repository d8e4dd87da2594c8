// Group-wise quantization with a zero point and optional stochastic rounding (lmdeploy's
// QuantizeGroupwise, docs/formats.md section 6), and its inverse.
//
//   quantize_groups<ZeroPoint<BITS>, T, ...>    codes, scales, zeros and the reconstruction;
//                                               `mode` picks the rounding (ZpMode);
//                                               ZeroPoint<BITS, ZP_NEAREST> only rounds to
//                                               nearest, ZeroPoint<BITS, ZP_PHILOX> only
//                                               rounds with seeded words
//   dequantize_groups<ZeroPointCodes<BITS, TS>, Tout, VEC, UNROLL, WARP_PARAMS>
//   dequantize_groups_spanning<ZeroPointCodes<BITS, TS>, Tout, VEC, NP, UNROLL>
#include "groups.cuh"

namespace cq {

enum ZpMode { ZP_NEAREST = 0, ZP_RBITS = 1, ZP_PHILOX = 2 };
constexpr int ZP_ANY = -1;   // a build that serves every mode
// A flag over the rounding mode: symmetric parameters (below). It changes prepare alone, so
// every build serves it; mode_of sees the rounding without it.
constexpr int ZP_SYMMETRIC = 4, ZP_ROUNDING = 3;

// s = T(max(hi - lo, f32(1e-5)) / (2**BITS - 1)); z = clamp(rne(-lo / s), 0, 2**BITS - 1);
// ZP_SYMMETRIC: s = T(max(max(|lo|, |hi|), f32(1e-5)) / ((2**BITS - 1) / 2)), z = 2**(BITS-1);
// q = clamp(R(x / s) + z, 0, 2**BITS - 1), R rne or stochastic; NaN gives code 0;
// reconstruction T(f32(q - z) * s). Codes are unsigned, 4-bit ones packed first-low.
//
// With integer bounds, clamp(R(v) + z, 0, Q) equals R(clamp(v, -z, Q - z)) + z for both
// roundings, and the clamped value is small enough for the 1.5 * 2**23 rounding trick.
// The stochastic modes work on v * 2**24 (the reciprocal and the bounds scaled, exact), so
// that the fraction compared with the 24 random bits comes out scaled, and 1.5 * 2**47 (an
// ulp of 2**24) rounds. The reconstruction is one fma: q - z = r - M for the rounded r (M
// the trick's constant), and M * s is exact for a 16-bit s, so fma(r, s, -M * s) rounds
// (q - z) * s once.
// ONLY builds the format for one mode alone, without the other modes' code: smaller, with
// fewer registers and branches a unit. ZP_NEAREST serves rounding to nearest's staged
// and tile kernels, ZP_PHILOX seeded rounding's tile kernel, which then fits 64 registers
// a thread (four blocks a multiprocessor, against two for the others). ZP_PHILOX also takes
// the high word of every Philox counter as 0, so it serves tensors of at most 2**34
// elements (the host gives larger ones the general build).
template <int B, int ONLY = ZP_ANY>
struct ZeroPoint {
    static constexpr int BITS = B;
    static constexpr bool LOW_FIRST = true, DEQUANT = true, ALT_RANDOM = true;
    static constexpr int QMAX = (1 << B) - 1;
    // The tile kernel takes one tile a warp here (the host's grid), so nothing to prefetch.
    static constexpr bool PREFETCH = false;
    static constexpr int TILE_BLOCKS = ONLY == ZP_PHILOX ? 4 : 2;
    // What encode reads first, in two 16-byte words: the two-pass kernel keeps a group's
    // Params in shared memory and reads them for every unit.
    struct __align__(16) Params {
        float nb, y;      // -s and RN(1/s), x / s on the fast path (times 2**24 if STOCH)
        float sd, ms;     // s (times 2**-24 if STOCH) and -M * s: the reconstruction's fma
        float lo_b, hi_b; // -z and Q - z, the clamp (times 2**24 if STOCH)
        u32 zi;
        bool careful;     // s is inf or NaN, or x / s needs div.rn (see prepare)
    };
    static constexpr float SCALE = 16777216.0f;   // 2**24, the stochastic modes' scale
    __device__ static __forceinline__ float unscale() { return u2f(0x33800000u); }   // 2**-24
    __device__ static __forceinline__ float magic(bool stoch) { return stoch ? u2f(0x57400000u) : RNE_MAGIC; }

    template <typename T>
    __device__ static __forceinline__ Params prepare(float lo, float hi, const QuantArgs& a) {
        Params p;
        float s;
        if (a.mode & ZP_SYMMETRIC) {
            // (2**BITS - 1) / 2 is exact: 7.5 or 127.5.
            const float amax = fmax_nan(fabs_bits(lo), fabs_bits(hi));
            s = to_f32(from_f32<T>(div_rn(fmax_nan(amax, u2f(0x3727C5ACu)), 0.5f * (float)QMAX)));
            p.zi = 1u << (B - 1);
        } else {
            const float range = fmax_nan(sub_rn(hi, lo), u2f(0x3727C5ACu));   // f32(1e-5)
            s = to_f32(from_f32<T>(div_rn(range, (float)QMAX)));
            const float zq = div_rn(fneg(lo), s);
            p.zi = is_nan(zq) ? 0u : f2u(add_rn(fclamp(zq, 0.0f, (float)QMAX), RNE_MAGIC)) - RNE_MAGIC_BITS;
        }
        const bool stoch = mode_of(a) != ZP_NEAREST;
        const float k = stoch ? SCALE : 1.0f, ik = stoch ? unscale() : 1.0f;
        p.lo_b = mul_rn(fneg((float)p.zi), k);
        p.hi_b = mul_rn((float)(QMAX - (int)p.zi), k);
        const DivPlan plan = plan_division(s);
        // s is 0 or at least 2**-25 here, so the scaled divisor s * 2**-24 stays normal.
        p.nb = mul_rn(plan.nb, ik);
        p.y = mul_rn(plan.y, k);
        p.sd = mul_rn(s, ik);
        p.ms = mul_rn(fneg(RNE_MAGIC), s);   // exact: s has at most 11 significant bits
        // divide() is exact while |x| <= 2**9 s; beyond, this group takes div.rn.
        const float amax = fmax_nan(fabs_bits(lo), fabs_bits(hi));
        const bool wide = !(f2u(amax) <= f2u(mul_rn(s, 512.0f)));
        // (The plan never prescales here; checked all the same. M * s overflows for a bf16
        // s from about 2**104 on.)
        p.careful = wide || plan.exact || plan.scaled || !finite(s) || !finite(p.ms);
        return p;
    }

    // The group's scale, from the Params of the mode they were prepared for.
    __device__ static __forceinline__ float scale(const Params& p, bool stoch) {
        return stoch ? mul_rn(p.sd, SCALE) : p.sd;
    }

    template <typename T>
    __device__ static __forceinline__ void store_params(const Params& p, i64 g, void* p0, void* p1,
                                                        const QuantArgs& a) {
        static_cast<T*>(p0)[g] = from_f32<T>(scale(p, mode_of(a) != ZP_NEAREST));
        static_cast<T*>(p1)[g] = from_f32<T>((float)p.zi);
    }

    // The rounding a call runs: the build's own, or the host's.
    __device__ static __forceinline__ int mode_of(const QuantArgs& a) {
        return ONLY == ZP_ANY ? (a.mode & ZP_ROUNDING) : ONLY;
    }

    // The random words of the unit at element e.
    template <int VEC, bool ALIGNED = true>
    __device__ static __forceinline__ void random(u32 (&r)[VEC], i64 e, const QuantArgs& a, const u32* rbits) {
        if (mode_of(a) == ZP_RBITS) {
            if constexpr (ALIGNED) {
                const Vec<u32, VEC> w = load_unit<u32, VEC>(rbits + e);
#pragma unroll
                for (int k = 0; k < VEC; ++k) r[k] = w.v[k];
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) r[k] = rbits[e + k];
            }
        } else if (mode_of(a) == ZP_PHILOX) {
            // e is a multiple of VEC: a unit of four elements or fewer lies in one block of
            // words, a longer one spans whole blocks. One block is made for each.
            static_assert(VEC % 4 == 0 || 4 % VEC == 0, "units lie in whole blocks of words");
#pragma unroll
            for (int k = 0; k < VEC; k += 4) {
                // A counter's high word known to be 0 saves a round's product and the
                // 64-bit arithmetic: 1.3 of about 29 instructions an element (sm_90).
                const u64 c = (u64)(e + k) >> 2;
                const Words4 b = ONLY == ZP_PHILOX
                                     ? philox4x32_10((u32)c, 0u, 0u, 0u, a.seed_lo, a.seed_hi)
                                     : philox_block(c, a.seed_lo, a.seed_hi);
#pragma unroll
                for (int j = 0; j < (VEC < 4 ? VEC : 4); ++j) {
                    if constexpr (VEC >= 4) {
                        r[k + j] = b.w[j];
                    } else {
                        const int w = (int)((e + j) & 3);
                        r[j] = w == 0 ? b.w[0] : w == 1 ? b.w[1] : w == 2 ? b.w[2] : b.w[3];
                    }
                }
            }
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) r[k] = 0u;
        }
    }

    // The code in the low BITS bits of the result; d gets f32(q - z) * s.
    // The stochastic variant, compiled apart.
    __device__ static __forceinline__ bool alternate(const QuantArgs& a) {
        return mode_of(a) != ZP_NEAREST;
    }

    // body(m), m being a with its rounding a constant, so that body's tests of it (the
    // random words of each unit among them) fold away; the symmetric flag is kept.
    template <class Body>
    __device__ static __forceinline__ void with_mode(const QuantArgs& a, Body body) {
        QuantArgs m = a;
        const int sym = a.mode & ZP_SYMMETRIC;
        if constexpr (ONLY != ZP_ANY) {
            m.mode = ONLY | sym;
            body(m);
        } else if ((a.mode & ZP_ROUNDING) == ZP_NEAREST) {
            m.mode = ZP_NEAREST | sym;
            body(m);
        } else if ((a.mode & ZP_ROUNDING) == ZP_RBITS) {
            m.mode = ZP_RBITS | sym;
            body(m);
        } else {
            m.mode = ZP_PHILOX | sym;
            body(m);
        }
    }

    // CAREFUL divides with div.rn (any x, any s) and maps NaN to code 0. Otherwise x and s
    // are 16-bit values with |x| <= 2**9 s and s >= 2**-25, where the reciprocal and one
    // correction give x / s exactly (common.cuh) wherever it can move a code or a stochastic
    // comparison: |x / s| >= 2**-26, so |x| >= 2**-51. Below, the quotient keeps its sign
    // and stays below 2**-25, which is all the results need. The sign of a zero quotient is
    // never looked at: the clamp, the rounding and the comparison treat -0 as +0.
    //
    // STOCH: v and c are x / s * 2**24, and M = 1.5 * 2**47 (its low bits those of 1.5 * 2**23).
    template <bool CAREFUL, bool STOCH, typename>
    __device__ static __forceinline__ u32 encode(float x, const Params& p, u32 rnd, float& d) {
        const float M = magic(STOCH);
        const float v = CAREFUL ? mul_rn(div_rn(x, scale(p, STOCH)), STOCH ? SCALE : 1.0f)
                                : divide_by_reciprocal<1>(x, p.nb, p.y);
        if (CAREFUL && is_nan(v)) {
            d = mul_rn(sub_rn(0.0f, (float)p.zi), scale(p, STOCH));
            return 0u;
        }
        const float c = fclamp(v, p.lo_b, p.hi_b);
        if (!STOCH) {
            const float r = add_rn(c, M);               // rne(c) + M
            d = reconstruct<CAREFUL>(r, M, p);
            return f2u(r) + p.zi;
        }
        const float r = add_rm(c, M);                   // floor(v) * 2**24 + M
        const float t = sub_rn(c, sub_rn(r, M));        // frac(v) * 2**24, rounded as f32(v - floor(v))
        const float ru = fma_rn(set_lt((float)(rnd >> 8), t), SCALE, r);   // 2**24 more to round up
        d = reconstruct<CAREFUL>(ru, M, p);
        return f2u(ru) + p.zi;
    }

    // (q - z) * s from the rounded r = q - z + M (times 2**24 and s * 2**-24 if STOCH).
    // CAREFUL: s may be inf or NaN, and M * s may overflow.
    template <bool CAREFUL>
    __device__ static __forceinline__ float reconstruct(float r, float M, const Params& p) {
        return CAREFUL ? mul_rn(sub_rn(r, M), p.sd) : fma_rn(r, p.sd, p.ms);
    }
};

// Dequantization: Tout(f32(f32(q) - f32(z)) * f32(s)), s and z of type TS.
template <int B, typename TS>
struct ZeroPointCodes {
    static constexpr int BITS = B;
    static constexpr bool SIGNED = false, LOW_FIRST = true;
    // 4-bit codes prefetched a wave on (groups/dequantize.cuh), which measured faster; 8-bit
    // codes measured slower with it.
    static constexpr bool L2_PREFETCH = B == 4;
    struct Params { float s, z; };
    __device__ static __forceinline__ Params load(i64 g, const void* p0, const void* p1) {
        return Params{to_f32(static_cast<const TS*>(p0)[g]), to_f32(static_cast<const TS*>(p1)[g])};
    }
    // A warp's parameters: the scale from p0, the zero from p1.
    __device__ static __forceinline__ const void* param_addr(i64 g, bool second, const void* p0, const void* p1) {
        return static_cast<const TS*>(second ? p1 : p0) + g;
    }
    __device__ static __forceinline__ float lane_param(i64 g, bool second, const void* p0, const void* p1) {
        return to_f32(*static_cast<const TS*>(param_addr(g, second, p0, p1)));
    }
    __device__ static __forceinline__ Params from_lanes(float w, int j) {
        return Params{__shfl_sync(0xffffffffu, w, j), __shfl_sync(0xffffffffu, w, 16 + j)};
    }
    __device__ static __forceinline__ float value(float c, const Params& p) {
        return mul_rn(sub_rn(c, p.z), p.s);
    }
};

}  // namespace cq
