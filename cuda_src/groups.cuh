// Group-wise integer quantization machinery, shared by groupwise.cu (DeepSpeed format,
// docs/formats.md section 5) and zero_point.cu (lmdeploy format, docs/formats.md section 6).
//
// A tensor is a run of `groups` groups of G consecutive elements (C order). A kernel works
// on "units" of VEC consecutive elements: on the fast path a unit is 16 bytes of the wide
// side (VEC = 8 for 16-bit data, 4 for float32; G % VEC == 0 and aligned data), so that
// every lane loads or stores 16 contiguous bytes and a warp whole sectors; on the general
// path (any G, any alignment) VEC = 1, or 2 for 4-bit codes, so that a unit is one byte
// of packed codes, with scalar accesses. The quantizer is one template over a format
// policy F:
//
//   F::BITS, F::LOW_FIRST       code width and nibble order (first element in the low
//                               nibble?)
//   F::Params                   what a group needs to encode, made by F::prepare(lo, hi, ...)
//   F::store_params             writes a group's parameters
//   F::encode<CAREFUL, ALT, T>  one element (of input type T) to its code (and its
//                               reconstruction, when the format returns one); CAREFUL
//                               handles groups whose arithmetic can meet NaN (non-finite
//                               statistics or multipliers); ALT is the format's second
//                               variant (symmetric, stochastic), chosen once a launch by
//                               F::alternate(args)
//   F::random<VEC, ALIGNED>     the random words of a unit (stochastic rounding); ALIGNED:
//                               the caller's words at the unit are 16-byte aligned
//   F::ALT_RANDOM               whether the second variant uses random words
//   F::with_mode(args, body)    body(args) with the run-time mode made a constant, one
//                               copy of body a mode (the tile kernel's loops)
//   F::PREFETCH                 the tile kernel loads a warp's next tile while it encodes
//                               the one before (for a grid of fewer warps than tiles)
//   F::TILE_BLOCKS              the tile kernel's blocks a multiprocessor (its registers)
//
// Group statistics are the NaN-propagating minimum and maximum, taken with PTX
// max.NaN / min.NaN (IEEE 754-2019 maximum / minimum: a NaN wins, -0 < +0), on two 16-bit
// elements at once for half and bfloat16. No float comparison below is left to the
// compiler, since CuPy's -ftz=true would make it flush subnormals.
#pragma once
#include "common.cuh"
#include "staged.cuh"

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

// ---------------------------------------------------------------------------------------
// Units: VEC consecutive elements

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_unit(const T* p) {
    Vec<T, VEC> r;
    if constexpr (VEC * sizeof(T) == 16) {
        r = load_vec<T, VEC>(p);
    } else if constexpr (VEC * sizeof(T) == 32) {
        const Vec<T, VEC / 2> a = load_vec<T, VEC / 2>(p), b = load_vec<T, VEC / 2>(p + VEC / 2);
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            r.v[k] = a.v[k];
            r.v[VEC / 2 + k] = b.v[k];
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.v[k] = p[k];
    }
    return r;
}

// WHOLE writes a 16-byte unit with the store intrinsic, one instruction whatever the
// compiler makes of the code around it: in the two-pass quantizer a plain store of the zero
// point's reconstruction came out as six 16-bit and two 32-bit stores for each lane's first
// unit (0.81 -> 0.85 of copy once whole, benchmarks/NOTES.md).
template <typename T, int VEC, bool WHOLE = false>
__device__ __forceinline__ void store_unit(T* p, const Vec<T, VEC>& v) {
    if constexpr (VEC * sizeof(T) == 16 && WHOLE) {
        const u32* w = reinterpret_cast<const u32*>(&v);
        __stwb(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
    } else if constexpr (VEC * sizeof(T) == 16) {
        store_vec<T, VEC>(p, v);
    } else if constexpr (VEC * sizeof(T) == 32) {
        Vec<T, VEC / 2> a, b;
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            a.v[k] = v.v[k];
            b.v[k] = v.v[VEC / 2 + k];
        }
        store_vec<T, VEC / 2>(p, a);
        store_vec<T, VEC / 2>(p + VEC / 2, b);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = v.v[k];
    }
}

// The bits of a where mask has ones, of b elsewhere, in one instruction.
__device__ __forceinline__ u32 bit_select(u32 a, u32 b, u32 mask) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(r) : "r"(a), "r"(mask), "r"(b));
    return r;
}

// Codes of a unit (their low BITS bits) to memory: 8-bit codes at q[e], 4-bit codes two a
// byte at q[e / 2], the first of a pair in the low nibble when LOW_FIRST; e = base + el.
// base and el are even for 4-bit codes (a chunk and a unit start on whole bytes), so that
// the address of a chunk's codes is worked out once, not a unit at a time.
template <int BITS, bool LOW_FIRST, int VEC>
__device__ __forceinline__ void store_codes(u8* q, i64 base, i64 el, const u32 (&r)[VEC]) {
    q += BITS == 8 ? base : base >> 1;
    if constexpr (BITS == 8) {
        if constexpr (VEC == 8) {
            Vec<u32, 2> w;
            w.v[0] = pack_bytes(r[0], r[1], r[2], r[3]);
            w.v[1] = pack_bytes(r[4], r[5], r[6], r[7]);
            store_vec<u32, 2>(reinterpret_cast<u32*>(q + el), w);
        } else if constexpr (VEC == 4) {
            *reinterpret_cast<u32*>(q + el) = pack_bytes(r[0], r[1], r[2], r[3]);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) q[el + k] = (u8)r[k];
        }
    } else if constexpr (VEC == 8) {
        // The first and the second elements of the pairs, a byte each, then one shift and
        // one bit select (against a shift and a select a pair).
        const u32 first = pack_bytes(r[0], r[2], r[4], r[6]), second = pack_bytes(r[1], r[3], r[5], r[7]);
        *reinterpret_cast<u32*>(q + (el >> 1)) = LOW_FIRST ? bit_select(second << 4, first, 0xf0f0f0f0u)
                                                          : bit_select(first << 4, second, 0xf0f0f0f0u);
    } else {
        static_assert(VEC % 2 == 0, "4-bit units hold whole bytes");
        u32 t[VEC / 2];
#pragma unroll
        for (int j = 0; j < VEC / 2; ++j)
            t[j] = LOW_FIRST ? ((r[2 * j] & 0xfu) | (r[2 * j + 1] << 4))
                             : ((r[2 * j] << 4) | (r[2 * j + 1] & 0xfu));
        if constexpr (VEC == 4) {
            *reinterpret_cast<u16*>(q + (el >> 1)) = (u16)prmt(t[0], t[1], 0x0040u);
        } else {
#pragma unroll
            for (int j = 0; j < VEC / 2; ++j) q[(el >> 1) + j] = (u8)t[j];
        }
    }
}

// Codes of a unit as loaded: the packed bytes, in one or two words.
template <int BITS, int VEC>
struct CodeUnit {
    static constexpr int WORDS = BITS * VEC > 32 ? 2 : 1;
    u32 w[WORDS];
    __device__ __forceinline__ void load(const u8* q, i64 e) {
        const u8* p = q + (BITS == 8 ? e : e / 2);
        if constexpr (BITS * VEC == 64) {
            const Vec<u32, 2> v = load_vec<u32, 2>(reinterpret_cast<const u32*>(p));
            w[0] = v.v[0];
            w[1] = v.v[1];
        } else if constexpr (BITS * VEC == 32) {
            w[0] = *reinterpret_cast<const u32*>(p);
        } else if constexpr (BITS * VEC == 16) {
            w[0] = *reinterpret_cast<const u16*>(p);
        } else {
            static_assert(BITS * VEC == 8, "a unit holds 1, 2, 4 or 8 bytes of codes");
            w[0] = *p;
        }
    }
    // As float32 (exact). SIGNED codes are two's complement.
    template <bool SIGNED, bool LOW_FIRST>
    __device__ __forceinline__ void decode(float* f) const {
        constexpr float BIAS8 = SIGNED ? 8388736.0f : 8388608.0f;   // 2**23 (+ 128)
        constexpr float BIAS4 = SIGNED ? 8388616.0f : 8388608.0f;   // 2**23 (+ 8)
        constexpr u32 FLIP8 = SIGNED ? 0x80808080u : 0u, FLIP4 = SIGNED ? 8u : 0u;
        if constexpr (BITS == 8) {
#pragma unroll
            for (int h = 0; h < WORDS; ++h) {
                const u32 b = w[h] ^ FLIP8;   // 0x4B0000bb is 2**23 + bb
#pragma unroll
                for (int k = 0; k < (VEC < 4 ? VEC : 4); ++k)
                    f[4 * h + k] = u2f(prmt(b, 0x4B000000u, 0x7540u + (u32)k)) - BIAS8;
            }
        } else if constexpr (VEC >= 4) {
            // The low and the high nibbles of every byte, each set in one instruction or
            // two, then one byte permute an element (against a shift and a mask each).
            const u32 lo = (w[0] & 0x0f0f0f0fu) ^ (FLIP4 * 0x01010101u);
            const u32 hi = ((w[0] >> 4) & 0x0f0f0f0fu) ^ (FLIP4 * 0x01010101u);
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                f[k] = u2f(prmt((k % 2 == 0) == LOW_FIRST ? lo : hi, 0x4B000000u, 0x7540u + (u32)(k / 2))) - BIAS4;
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const int shift = 8 * (k / 2) + ((k % 2 == 0) == LOW_FIRST ? 0 : 4);
                f[k] = u2f(0x4B000000u | (((w[0] >> shift) & 0xfu) ^ FLIP4)) - BIAS4;
            }
        }
    }
};

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
// have built such code (benchmarks/NOTES.md, eleventh and twenty-first rounds;
// benchmarks/sass_audit.py). The careful arithmetic gives every group its bits, so the
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
        // eight different 16-byte slots. On an H200 it gained 0.01-0.02 of copy at 4 and 8
        // units (8-bit G=32, 64) and was level to 0.008 slower at 16, so groups of more than
        // 8 units keep the plain order.
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
// The quantizer on tiles held in registers, on the fast path, for groups of UPG 16-byte
// units (UPG divides 32). A warp takes a tile of 32 K consecutive units, lane l units
// l + 32 k (k < K), all loaded before the first is used. At step k the warp's 32 units are
// 32 / UPG whole groups of UPG lanes, reduced by shuffles (reduce_steps), after which each
// lane holds whole groups' statistics and prepares them: the format's prepare runs once
// for up to 32 groups, not once for each. The units take their group's Params from shared
// memory and are encoded from the registers. The data never passes through shared memory:
// the staged kernels' ring alone held the zero point's quantizer to 0.90 of copy on an
// H200 (benchmarks/NOTES.md).
//
// A warp takes tiles a grid apart. The host sizes the grid to the device (DeepSpeed's
// format: each warp then takes many tiles, and with F::PREFETCH loads its next tile before
// it encodes this one: 8 more registers of 16 bytes, 0.95 -> 0.96 of copy on an H200) or
// to the tiles (the zero point: a warp a tile, which with three outputs to write measured
// 0.90 -> 0.955 there; benchmarks/NOTES.md).
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
// The quantizer for small groups off the fast path (a group not a whole number of 16-byte
// units, or x not 16-byte aligned): a block takes SMALL_THREADS consecutive groups at a
// time, one a thread. The 16-byte words that hold their elements are loaded into shared
// memory, coalesced; each thread reduces, prepares and encodes its group from there, its
// codes a byte each into shared memory (and its reconstruction over its input); then the
// block writes the codes out, packed, as whole words of q but at its ends, and the
// reconstructions. The general kernel (quantize_groups with one byte of codes a unit)
// reads each group with a team of threads, an element a thread: 0.07-0.20 of copy on an
// H200 where this one measured 0.39-0.65 (benchmarks/NOTES.md, twenty-first round).
//
// Shared memory (the host's small_smem_bytes): the words of a chunk's elements, one more
// for the chunk's start within its first word, then a byte a code, moved by up to 6 bytes.
constexpr int SMALL_THREADS = 256;

// With random words, the elements from a multiple of four on go four at a time, so that
// seeded rounding makes one block of four words for four elements, not one for each (G=20
// on an H200: 0.24 -> 0.44 of copy). Without, one loop: the three cost DeepSpeed's
// symmetric G=63 0.43 -> 0.37 (benchmarks/NOTES.md, twenty-second round).
template <class F, typename T, bool CAREFUL, bool ALT>
__device__ __forceinline__ void encode_small_group(T* gx, u8* gc, const typename F::Params& p, i64 e,
                                                   int G, const QuantArgs& a, const u32* rbits) {
    auto one = [&](int j, u32 rnd) {
        float d;
        gc[j] = (u8)F::template encode<CAREFUL, ALT, T>(to_f32(gx[j]), p, rnd, d);
        if constexpr (F::DEQUANT) gx[j] = from_f32<T>(d);
    };
    auto alone = [&](int j) {   // an element with a word of its own
        u32 rnd[1];
        F::template random<1>(rnd, e + j, a, rbits);
        one(j, rnd[0]);
    };
    if constexpr (!(ALT && F::ALT_RANDOM)) {
#pragma unroll 4
        for (int j = 0; j < G; ++j) one(j, 0u);
    } else {
        const int to4 = (int)((4 - (e & 3)) & 3), lead = to4 < G ? to4 : G;
        const int body = lead + ((G - lead) & ~3);
        int j = 0;
        for (; j < lead; ++j) alone(j);
        for (; j < body; j += 4) {
            u32 rnd[4];
            F::template random<4, false>(rnd, e + j, a, rbits);   // rbits may be unaligned here
#pragma unroll
            for (int k = 0; k < 4; ++k) one(j + k, rnd[k]);
        }
        for (; j < G; ++j) alone(j);
    }
}

template <class F, typename T>
__global__ void __launch_bounds__(SMALL_THREADS)
quantize_groups_small(const T* __restrict__ x, u8* __restrict__ q, void* __restrict__ p0,
                      void* __restrict__ p1, T* __restrict__ deq, const u32* __restrict__ rbits,
                      i64 groups, i64 group_size, int mode, u32 seed_lo, u32 seed_hi) {
    typedef MinMax<T> Acc;
    typedef typename F::Params Params;
    constexpr int NG = SMALL_THREADS;
    extern __shared__ Vec<u32, 4> small_words[];
    const int G = (int)group_size, t = threadIdx.x;
    const QuantArgs a{groups, group_size, group_size, mode, seed_lo, seed_hi};
    // The codes are placed so that those of q's first whole word start a word of shared
    // memory: a word of q is then one word of 8-bit codes, or two of 4-bit ones.
    constexpr int CPB = F::BITS == 8 ? 1 : 2;   // codes a byte of q
    u8* const code_area = reinterpret_cast<u8*>(small_words + (NG * G * (int)sizeof(T) + 31) / 16);
    for (i64 c = blockIdx.x; c * NG < groups; c += gridDim.x) {
        const i64 g0 = c * NG, e0 = g0 * G;
        const int ng = (int)(groups - g0 < NG ? groups - g0 : NG), ne = ng * G;
        u8* const qo = q + e0 / CPB;   // e0 is even (NG is): a chunk holds whole bytes of q
        const int nb = ne / CPB, head = (int)((4 - (reinterpret_cast<u64>(qo) & 3)) & 3);
        u8* const codes = code_area + CPB * ((4 - head) & 3);
        const u64 start = reinterpret_cast<u64>(x + e0), first = start & ~(u64)15;
        const int words = (int)((start + (u64)ne * sizeof(T) - first + 15) >> 4);
        const Vec<u32, 4>* src = reinterpret_cast<const Vec<u32, 4>*>(first);
#pragma unroll 4
        for (int i = t; i < words; i += NG) small_words[i] = src[i];
        T* xs = reinterpret_cast<T*>(reinterpret_cast<u8*>(small_words) + (start - first));
        __syncthreads();
        bool mine = false;
        Params p;
        if (t < ng) {
            Acc acc;
#pragma unroll 4
            for (int j = 0; j < G; ++j) acc.add(xs[t * G + j]);
            u32 w[Acc::WORDS];
            acc.pack(w);
            float lo, hi;
            Acc::unpack(w, lo, hi);
            p = F::template prepare<T>(lo, hi, a);
            F::template store_params<T>(p, g0 + t, p0, p1, a);
            mine = p.careful;
        }
        // A choice for the whole warp (warp_careful), the mode's loops built apart.
        const bool careful = warp_careful(mine);
        if (t < ng) {
            F::with_mode(a, [&](const QuantArgs& m) {
                T* gx = xs + t * G;
                u8* gc = codes + t * G;
                const i64 e = e0 + (i64)t * G;
                if (careful) {
                    if (F::alternate(m)) encode_small_group<F, T, true, true>(gx, gc, p, e, G, m, rbits);
                    else encode_small_group<F, T, true, false>(gx, gc, p, e, G, m, rbits);
                } else {
                    if (F::alternate(m)) encode_small_group<F, T, false, true>(gx, gc, p, e, G, m, rbits);
                    else encode_small_group<F, T, false, false>(gx, gc, p, e, G, m, rbits);
                }
            });
        }
        __syncthreads();
        // The bytes of q before its first whole word, the words, the bytes after.
        auto byte_of = [&](int i) -> u32 {
            if constexpr (F::BITS == 8) {
                return codes[i];
            } else {
                const u32 c0 = codes[2 * i] & 0xfu, c1 = codes[2 * i + 1] & 0xfu;
                return F::LOW_FIRST ? c0 | (c1 << 4) : (c0 << 4) | c1;
            }
        };
        const int lead = head < nb ? head : nb, q_words = (nb - lead) >> 2;
        if (t < lead) qo[t] = (u8)byte_of(t);
        u32* const qw = reinterpret_cast<u32*>(qo + lead);
        for (int w = t; w < q_words; w += NG) {
            if constexpr (F::BITS == 8) {
                qw[w] = *reinterpret_cast<const u32*>(codes + lead + 4 * w);
            } else {
                const Vec<u32, 2> c8 = *reinterpret_cast<const Vec<u32, 2>*>(codes + 2 * (lead + 4 * w));
                // Bytes (c0 c1 c2 c3) (c4 c5 c6 c7), codes in their low nibbles: the firsts
                // of the pairs c0 c2 c4 c6 and the seconds c1 c3 c5 c7, a byte each.
                const u32 first = prmt(c8.v[0], c8.v[1], 0x6420u) & 0x0f0f0f0fu;
                const u32 second = prmt(c8.v[0], c8.v[1], 0x7531u) & 0x0f0f0f0fu;
                qw[w] = F::LOW_FIRST ? first | (second << 4) : (first << 4) | second;
            }
        }
        for (int i = lead + 4 * q_words + t; i < nb; i += NG) qo[i] = (u8)byte_of(i);
        if constexpr (F::DEQUANT) {
            for (int i = t; i < ne; i += NG) deq[e0 + i] = xs[i];
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------
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
// so that a wave of an H200 is 132 x 64 warps: the warp whose codes a warp prefetches runs
// a wave later. Held to 32 registers, the prefetching kernels (40 without the bound) measured
// 0.918 -> 0.928 of copy for the zero point's 4 bits (benchmarks/NOTES.md, twenty-fifth round).
constexpr int DQ_WARP_BLOCKS = 8;
constexpr i64 DQ_L2_AHEAD = 132 * DQ_WARP_BLOCKS * (DQ_THREADS / 32);

// The fast path with the parameters shared by a warp: a warp takes 64 consecutive units
// (round k: unit base + 32 k + lane), whose groups are at most 16 when a group holds at
// least 4 units (the host's condition). Lane j of the first half loads the first parameter
// of the warp's group j, lane j of the second half its second, and shuffles hand them to
// the units: one load for the warp's groups where each unit's lane loaded its own. On an
// H200 (fp16, 16384 x 7168, G=128) the zero point's 4-bit dequantizer went from 0.87 to
// 0.92 of copy and DeepSpeed's from 0.92 to 0.925-0.929 (benchmarks/NOTES.md).
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
// A thread's UNROLL units are a grid apart (measured faster on an H200 than a block
// taking a contiguous chunk; the best UNROLL depends on the format, see the host side).
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
// most (G >= VEC), NP = VEC where it may span one group an element (G < VEC). The general
// path (a byte of codes a unit, a thread each) measured 0.33-0.57 of copy on an H200 at
// G = 6, 20 and 63 (benchmarks/NOTES.md, twenty-second round). The last n % VEC elements
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
