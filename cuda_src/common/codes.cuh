// The code formats: int8 and float8_e4m3fn encoders and decoders.
#pragma once
#include "common/vector.cuh"

namespace cq {

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

}  // namespace cq
