// Units: VEC consecutive elements, loaded, reduced and stored together.
#pragma once
#include "groups/stats.cuh"

namespace cq {

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
// unit.
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

}  // namespace cq
