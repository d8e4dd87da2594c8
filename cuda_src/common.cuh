// Primitives shared by every cuquant kernel: storage types, vector memory access,
// non-flushing float arithmetic, exact division, rounding, code encoders and decoders,
// and reductions. One copy of each.
//
// The file needs no CUDA header, so NVRTC compiles it without an include path.
//
// CuPy compiles every module with -ftz=true, which would flush subnormal inputs, scales
// and quotients to zero. Every float operation on a quantization path is therefore
// written as explicit PTX without .ftz, and maxima are taken on the float bits.
#pragma once

namespace cq {

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef signed char i8;

// 16-bit float storage: raw bits, converted explicitly below.
struct half { u16 bits; };
struct bfloat16 { u16 bits; };

// ---------------------------------------------------------------------------------------
// Type traits (no <type_traits> under NVRTC without headers)

template <bool C, typename A, typename B> struct Conditional { typedef A type; };
template <typename A, typename B> struct Conditional<false, A, B> { typedef B type; };
template <typename A, typename B> struct IsSame { static constexpr bool value = false; };
template <typename A> struct IsSame<A, A> { static constexpr bool value = true; };

// ---------------------------------------------------------------------------------------
// Bit casts and small integer helpers

__device__ __forceinline__ u32 f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float u2f(u32 u) { return __uint_as_float(u); }
__device__ __forceinline__ u32 umax(u32 a, u32 b) { return a > b ? a : b; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ bool is_nan(float v) { return (f2u(v) & 0x7fffffffu) > 0x7f800000u; }

// The magnitude bits of m with the sign bit of s: (m & 0x7fffffff) | (s & 0x80000000) in one
// instruction (the compiler makes two of it; one fewer an element took the FP8 row
// quantizer from 0.69 to 0.79 of copy on an H200, benchmarks/NOTES.md).
__device__ __forceinline__ u32 copy_sign_bits(u32 m, u32 s) {
    u32 r;
    asm("lop3.b32 %0, %1, 0x7fffffff, %2, 0xE2;" : "=r"(r) : "r"(m), "r"(s));
    return r;
}

// Byte permute: selects bytes of {b, a} by the nibbles of s.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 s) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

// 1.5 * 2**23: adding it to |v| < 2**22 leaves rne(v) (or floor(v), with add.rm) in the
// low bits of the sum.
constexpr float RNE_MAGIC = 12582912.0f;
constexpr u32 RNE_MAGIC_BITS = 0x4B400000u;

// ---------------------------------------------------------------------------------------
// Non-flushing float arithmetic (IEEE round to nearest even, subnormals kept)

__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
__device__ __forceinline__ float div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// Clamp of a value known not to be NaN (a NaN would give the bound).
__device__ __forceinline__ float fclamp(float v, float lo, float hi) {
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"(lo));
    asm("min.f32 %0, %0, %1;" : "+f"(r) : "f"(hi));
    return r;
}
__device__ __forceinline__ float rcp_rn(float a) {
    float r;
    asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}

// ---------------------------------------------------------------------------------------
// Division by a divisor shared by a whole group.
//
// A group's divisor b is prepared once (DivPlan); each element then costs one multiply and
// two Newton corrections (fewer where divide_fast says they suffice), which give the
// correctly rounded quotient: y = RN(1/b) makes
// RN(a*y) within 1.5 ulp, the first correction makes it faithful and the second exact
// (Markstein). That holds while the remainders stay normal, which the plan guarantees for
// |a| <= 2**9 * |b| (every element of a group whose b came from the group's own maximum)
// by scaling a and b by 2**100 when b is tiny. Any other divisor (0, inf, NaN, huge) falls
// back to div.rn.f32 for the whole group.

struct DivPlan {
    float b;        // divisor, prescaled
    float nb;       // -b, so the corrections need no negation per element
    float y;        // RN(1/b)
    float pre;      // 1 or 2**100, applied to every dividend
    bool scaled;    // pre != 1
    bool exact;     // true: use div.rn.f32 on the original divisor
    float b_orig;
};

__device__ __forceinline__ DivPlan plan_division(float b) {
    DivPlan p;
    u32 mag = f2u(b) & 0x7fffffffu;
    p.b_orig = b;
    p.exact = !(mag >= 0x00000001u && mag < 0x7e800000u);   // 0, >= 2**126, inf, NaN
    p.scaled = mag < 0x21800000u;                             // b < 2**-60: scale by 2**100
    p.pre = p.scaled ? u2f(0x71800000u) : 1.0f;
    p.b = mul_rn(b, p.pre);
    p.nb = u2f(f2u(p.b) ^ 0x80000000u);
    p.y = rcp_rn(p.b);
    return p;
}

// a / b from y = RN(1/b) and nb = -b with CORR Newton corrections: q = RN(a * y), then
// q = fma(fma(q, nb, a), y, q) per correction. Correctly rounded while the remainders are
// exact and the quotients normal, which holds for normal y, |a| >= 2**-100 and
// 2**-125 <= |a / b| <= 2**100. Two corrections are exact for any such a (Markstein). One
// is exact for a 16-bit a (bf16 or fp16, at most 11 significant bits) and any b, checked
// over every pair of significands (tests/test_gpu.py,
// test_division_by_reciprocal_every_16_bit_dividend). The sign of a zero or underflowing
// quotient may come out wrong; callers that care fix it.
template <int CORR>
__device__ __forceinline__ float divide_by_reciprocal(float a, float nb, float y) {
    float q = mul_rn(a, y);
#pragma unroll
    for (int i = 0; i < CORR; ++i) q = fma_rn(fma_rn(q, nb, a), y, q);
    return q;
}

// s / b for a prepared (not exact) plan and s already prescaled, |s| <= 2**9 |b| (which
// keeps it in the range above). One correction is also exact for any 16-bit s against
// b = RN(amax * f32(1/127)) or RN(amax * f32(1/448)) (tests/test_division.py), and none
// is needed when b is a power of two (s * RN(1/b) is then the exact quotient).
template <int CORR = 2>
__device__ __forceinline__ float divide_fast(float s, const DivPlan& p) {
    return divide_by_reciprocal<CORR>(s, p.nb, p.y);
}

// a / b correctly rounded, for |a| <= 2**9 |b| or any a when p.exact.
__device__ __forceinline__ float divide(float a, const DivPlan& p) {
    if (p.exact) return div_rn(a, p.b_orig);
    float q = divide_fast(mul_rn(a, p.pre), p);
    // The quotient's sign is sign(a) ^ sign(b), also for zeros.
    return u2f((f2u(q) & 0x7fffffffu) | ((f2u(a) ^ f2u(p.b)) & 0x80000000u));
}

// ---------------------------------------------------------------------------------------
// Element conversions

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<half>(half v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
template <> __device__ __forceinline__ float to_f32<bfloat16>(bfloat16 v) {
    return u2f(((u32)v.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ half from_f32<half>(float v) {
    half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}
template <> __device__ __forceinline__ bfloat16 from_f32<bfloat16>(float v) {
    bfloat16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

// Two floats rounded to a 16-bit type and packed, lo in the low half (one instruction).
template <typename T> __device__ __forceinline__ u32 pack_pair(float lo, float hi);
template <> __device__ __forceinline__ u32 pack_pair<half>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack_pair<bfloat16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// |v| as float bits; a NaN stays above every number, so an unsigned max of these bits is
// the NaN-propagating, subnormal-keeping maximum of |v|.
template <typename T> __device__ __forceinline__ u32 abs_bits(T v);
template <> __device__ __forceinline__ u32 abs_bits<float>(float v) { return f2u(v) & 0x7fffffffu; }
template <> __device__ __forceinline__ u32 abs_bits<half>(half v) {
    return f2u(to_f32(half{(u16)(v.bits & 0x7fffu)}));
}
template <> __device__ __forceinline__ u32 abs_bits<bfloat16>(bfloat16 v) {
    return ((u32)(v.bits & 0x7fffu)) << 16;
}

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
// again there stays. Measured on an H200 (benchmarks/NOTES.md): the INT8 dequantizers'
// code loads gain 0.86 -> 0.93 of copy with it (their per-row and per-block scales stay in
// L1); the FP8 ones lose (0.93 -> 0.83), so only the INT8 path uses it.
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

// ---------------------------------------------------------------------------------------
// Codes

// Symmetric int8, codes in [-127, 127]; NaN gives 0.
struct CodeInt8 {
    typedef i8 T;
    // v is the exact quotient x / scale.
    __device__ static __forceinline__ i8 encode(float v) {
        if (is_nan(v)) return 0;
        // The magic add rounds to an integer, half to even; the low byte is the code.
        return (i8)(f2u(add_rn(fclamp(v, -127.0f, 127.0f), RNE_MAGIC)) & 0xffu);
    }
    __device__ static __forceinline__ float decode(i8 c) { return (float)(int)c; }
};

// float8_e4m3fn (max 448, NaN = 0x7F, no infinities).
struct CodeE4M3 {
    typedef u8 T;
    // Encodes clamp(v, -448, 448), rounded to nearest even; NaN gives 0x7F.
    __device__ static __forceinline__ u8 encode(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        // satfinite clamps to +-448 exactly as the explicit clamp would, and maps NaN to 0x7F.
        u16 r;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v));
        return (u8)(r & 0xffu);
#else
        return encode_soft(v);
#endif
    }
    // Bit-level encoder for chips without fp8 conversion (sm_80).
    __device__ static __forceinline__ u8 encode_soft(float v) {
        u32 bits = f2u(v);
        u32 sign = (bits >> 24) & 0x80u;
        u32 mag = bits & 0x7fffffffu;
        if (mag > 0x7f800000u) return 0x7f;                 // NaN
        if (mag >= 0x43e00000u) return (u8)(sign | 0x7e);  // |v| >= 448: clamp
        if (mag < 0x3c800000u) {                            // |v| < 2**-6: subnormal codes
            float scaled = mul_rn(u2f(mag), 512.0f);        // |v| * 2**9, exact
            int m;
            asm("cvt.rni.s32.f32 %0, %1;" : "=r"(m) : "f"(scaled));
            return (u8)(sign | (u32)m);                     // m == 8 is the smallest normal
        }
        // Normal: round the 23-bit mantissa to 3 bits, half to even; a carry moves the exponent.
        u32 r = mag + 0x7ffffu + ((mag >> 20) & 1u);
        u32 e = (r >> 23) - 127u + 7u;
        u32 m = (r >> 20) & 7u;
        return (u8)(sign | (e << 3) | m);
    }
    __device__ static __forceinline__ float decode(u8 c) {
        u32 sign = ((u32)c & 0x80u) << 24;
        u32 e = ((u32)c >> 3) & 0xfu;
        u32 m = (u32)c & 7u;
        if (e == 15u && m == 7u) return u2f(0x7fffffffu);
        if (e == 0u) return u2f(f2u(mul_rn((float)m, 0.001953125f)) | sign);   // m * 2**-9
        return u2f(sign | ((e + 120u) << 23) | (m << 20));
    }
};

// The low bytes of four words, as one word (a in the low byte).
__device__ __forceinline__ u32 pack_bytes(u32 a, u32 b, u32 c, u32 d) {
    return prmt(prmt(a, b, 0x0040u), prmt(c, d, 0x0040u), 0x5410u);
}

// Four codes as one word, the first in the low byte, each by the full encoder.
template <typename Code>
__device__ __forceinline__ u32 encode4(float a, float b, float c, float d) {
    return pack_bytes((u32)(u8)Code::encode(a), (u32)(u8)Code::encode(b), (u32)(u8)Code::encode(c),
                      (u32)(u8)Code::encode(d));
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
template <>
__device__ __forceinline__ u32 encode4<CodeE4M3>(float a, float b, float c, float d) {
    // cvt puts its first operand in the upper byte of each pair.
    u32 r;
    asm("{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;"
        " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3; mov.b32 %0, {lo, hi}; }"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}
#endif

// The codes of N elements as they are stored: a multiple of four one-byte codes as whole
// words, built and stored as words (as a byte array the compiler repacks them code by
// code, 2.5 instructions an element), else bytes.
template <typename Code, int N>
using CodeVec = typename Conditional<N % 4 == 0, Vec<u32, (N + 3) / 4>, Vec<typename Code::T, N>>::type;

template <typename Code, int N>
__device__ __forceinline__ void store_code_vec(typename Code::T* p, const CodeVec<Code, N>& c) {
    if constexpr (N % 4 == 0) {
        store_vec<u32, N / 4>(reinterpret_cast<u32*>(p), c);
    } else {
        store_vec<typename Code::T, N>(p, c);
    }
}

// Codes of N values by the full encoder (NaN, clamp).
template <typename Code, int N>
__device__ __forceinline__ CodeVec<Code, N> encode_vec(const float* v) {
    CodeVec<Code, N> out;
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k)
            out.v[k] = encode4<Code>(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out.v[i] = Code::encode(v[i]);
    }
    return out;
}

// N int8 codes from r = 1.5 * 2**23 + n for integers n (the rounding trick): the low byte
// of each one's bits is its code.
template <int N>
__device__ __forceinline__ CodeVec<CodeInt8, N> int8_codes_of_magic(const float* r) {
    CodeVec<CodeInt8, N> out;
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k)
            out.v[k] = pack_bytes(f2u(r[4 * k]), f2u(r[4 * k + 1]), f2u(r[4 * k + 2]), f2u(r[4 * k + 3]));
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out.v[i] = (i8)(f2u(r[i]) & 0xffu);
    }
    return out;
}

// Codes of quotients q = a / scale on the fast path of a dynamic scale: finite, and
// |q| < 127.5 for int8 where the scale is normal (|a| <= amax, and amax * f32(1/127) is
// then within 2**-23 of amax / 127; callers clamp int8 quotients where it may be
// subnormal), so no NaN test is needed; fp8's sign is taken from a (the scale is
// positive) and its satfinite conversion is the clamp.
template <typename Code, int N>
__device__ __forceinline__ CodeVec<Code, N> encode_fast(const float* q, const float* a) {
    if constexpr (IsSame<Code, CodeInt8>::value) {
        // 1.5 * 2**23 + q rounds q to an integer, half to even.
        float r[N];
#pragma unroll
        for (int i = 0; i < N; ++i) r[i] = add_rn(q[i], RNE_MAGIC);
        return int8_codes_of_magic<N>(r);
    } else {
        float v[N];
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = u2f(copy_sign_bits(f2u(q[i]), f2u(a[i])));
        return encode_vec<Code, N>(v);
    }
}

// Decodes a vector of codes to floats (exact).
template <typename Code, int VEC>
__device__ __forceinline__ void decode_vec(const Vec<typename Code::T, VEC>& c, float* f) {
    if constexpr (IsSame<Code, CodeInt8>::value && VEC % 4 == 0) {
        // 0x4B0000uu is 2**23 + uu: with the bytes biased by 128, one subtraction decodes.
        const u32* w = reinterpret_cast<const u32*>(&c);
#pragma unroll
        for (int k = 0; k < VEC / 4; ++k) {
            const u32 b = w[k] ^ 0x80808080u;
            f[4 * k + 0] = u2f(prmt(b, 0x4B000000u, 0x7540u)) - 8388736.0f;
            f[4 * k + 1] = u2f(prmt(b, 0x4B000000u, 0x7541u)) - 8388736.0f;
            f[4 * k + 2] = u2f(prmt(b, 0x4B000000u, 0x7542u)) - 8388736.0f;
            f[4 * k + 3] = u2f(prmt(b, 0x4B000000u, 0x7543u)) - 8388736.0f;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    } else if constexpr (IsSame<Code, CodeE4M3>::value && VEC % 2 == 0) {
        const u16* w = reinterpret_cast<const u16*>(&c);
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            u32 h2;
            asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(w[k]));
            f[2 * k] = to_f32(half{(u16)(h2 & 0xffffu)});
            f[2 * k + 1] = to_f32(half{(u16)(h2 >> 16)});
        }
#endif
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) f[i] = Code::decode(c.v[i]);
    }
}

// N floats rounded to the output type; for 16-bit types and even N, two a conversion
// straight into the vector's words, so that no 16-bit halves are shuffled after it.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> convert_vec(const float* f) {
    Vec<T, N> out;
    if constexpr ((IsSame<T, half>::value || IsSame<T, bfloat16>::value) && N % 2 == 0) {
        u32* w = reinterpret_cast<u32*>(&out);
#pragma unroll
        for (int k = 0; k < N / 2; ++k) w[k] = pack_pair<T>(f[2 * k], f[2 * k + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out.v[i] = from_f32<T>(f[i]);
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// Scale rules (docs/formats.md sections 3 and 4). inv_qmax is f32(1/qmax); eps_bits the floor's bits.

// ZERO_IS_ONE: amax * inv_qmax, 1 for amax 0; FLOOR_EPS: max(amax, eps) * inv_qmax; the
// _POW2 rules round that up to a power of two (UE8M0 scales).
enum ScaleRule { ZERO_IS_ONE = 0, FLOOR_EPS = 1, FLOOR_EPS_POW2 = 2, ZERO_IS_ONE_POW2 = 3 };

template <int RULE> struct PowerOfTwoRule {
    static constexpr bool value = RULE == FLOOR_EPS_POW2 || RULE == ZERO_IS_ONE_POW2;
};

// Smallest power of two >= s, from the bits; NaN and inf stay.
__device__ __forceinline__ float ceil_pow2(float s) {
    u32 b = f2u(s);
    u32 mag = b & 0x7fffffffu;
    if (mag >= 0x7f800000u || mag == 0u) return s;
    if (mag < 0x00800000u) {                       // subnormal: next power of two of the bits
        u32 p = 1u;
        while (p < mag) p <<= 1;
        return u2f((b & 0x80000000u) | p);
    }
    if ((mag & 0x007fffffu) == 0u) return s;
    return u2f((b & 0x80000000u) | ((mag & 0x7f800000u) + 0x00800000u));
}

template <int RULE>
__device__ __forceinline__ float scale_from_amax(u32 amax_bits, float inv_qmax, u32 eps_bits) {
    if (RULE == ZERO_IS_ONE) {
        return amax_bits == 0u ? 1.0f : mul_rn(u2f(amax_bits), inv_qmax);
    }
    if (RULE == ZERO_IS_ONE_POW2) {
        return amax_bits == 0u ? 1.0f : ceil_pow2(mul_rn(u2f(amax_bits), inv_qmax));
    }
    float s = mul_rn(u2f(umax(amax_bits, eps_bits)), inv_qmax);
    return RULE == FLOOR_EPS_POW2 ? ceil_pow2(s) : s;
}

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
