// Storage types, type traits, bit casts and small integer helpers.
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
__device__ __forceinline__ u32 umin(u32 a, u32 b) { return a < b ? a : b; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ bool is_nan(float v) { return (f2u(v) & 0x7fffffffu) > 0x7f800000u; }

// The magnitude bits of m with the sign bit of s: (m & 0x7fffffff) | (s & 0x80000000) in one
// instruction (the compiler makes two of it, and the FP8 quantizers are bound by their
// instructions an element).
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

}  // namespace cq
