// dequantize_mx: MXFP8, MXFP4 and NVFP4 codes back to floats.
#pragma once
#include "microscaling/formats.cuh"

namespace cq {

// The scale of block blk as float32: 2**(b - 127) for E8M0 scales, f32(f32(s) * S_dec)
// for NVFP4's e4m3 ones.
template <int FMT>
__device__ __forceinline__ float mx_block_scale(const u8* __restrict__ scales, i64 blk, i64 c,
                                                const FastDiv& cdiv, i64 cp4, int swizzled,
                                                float dec) {
    i64 idx = blk;
    if (swizzled) {
        const i64 r = cdiv.div(blk);
        idx = swizzled_index(r, blk - r * c, cp4);
    }
    const u32 b = scales[idx];
    if constexpr (FMT == NVFP4) {
        return mul_rn(CodeE4M3::decode((u8)b), dec);
    } else {
        return e8m0_value(b);
    }
}

// The codes are read in units of 16 bytes (MXFP8: 16 elements, half a block; the fp4
// formats: 32 elements, one MXFP4 block or two NVFP4 ones); a thread has UNROLL units in
// flight and writes 16-byte vectors of output. NVFP4 rows of an odd number of blocks can
// leave a last unit of 8 bytes (nbytes is the codes' size). ALIGNED false: q is not 16-byte
// aligned, read byte by byte.
template <int FMT, typename Tout, bool ALIGNED>
__global__ void __launch_bounds__(256)
dequantize_mx(const u8* __restrict__ q, const u8* __restrict__ scales, Tout* __restrict__ out,
              const float* __restrict__ amax_in, i64 nbytes, i64 c, u32 c_magic, u32 c_shift,
              i64 cp4, int swizzled, float amax_value) {
    constexpr int UNROLL = 2;
    constexpr bool FP4 = MxTraits<FMT>::FP4;
    constexpr int E = FP4 ? 32 : 16;                  // elements a unit
    constexpr int OV = 16 / (int)sizeof(Tout);        // elements a 16-byte store
    const i64 nunits = (nbytes + 15) >> 4;
    const FastDiv cdiv{c, c_magic, c_shift};
    float dec = 0.0f;
    if constexpr (FMT == NVFP4) dec = nv_global(amax_in != nullptr ? *amax_in : amax_value).dec;

    const i64 stride = (i64)gridDim.x * blockDim.x * UNROLL;
    for (i64 u0 = (i64)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; u0 < nunits; u0 += stride) {
        Vec<u32, 4> raw[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = u0 + (i64)k * blockDim.x;
            if (u >= nunits) continue;
            const u8* p = q + (u << 4);
            if (ALIGNED && (u << 4) + 16 <= nbytes) {
                raw[k] = load_vec<u32, 4>(reinterpret_cast<const u32*>(p));
            } else {
                const int nb = (int)((nbytes - (u << 4)) < 16 ? nbytes - (u << 4) : 16);
                u8 b[16];
#pragma unroll
                for (int i = 0; i < 16; ++i) b[i] = i < nb ? p[i] : 0;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    raw[k].v[i] = (u32)b[4 * i] | ((u32)b[4 * i + 1] << 8) | ((u32)b[4 * i + 2] << 16) |
                                  ((u32)b[4 * i + 3] << 24);
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = u0 + (i64)k * blockDim.x;
            if (u >= nunits) continue;
            const i64 e0 = u * E;                             // first element
            const int ne = (int)((nbytes - (u << 4)) < 16 ? (nbytes - (u << 4)) * (E / 16) : E);
            float f[E];
            if constexpr (FP4) {
                const float s0 = mx_block_scale<FMT>(scales, e0 / MxTraits<FMT>::BLOCK, c, cdiv, cp4,
                                                     swizzled, dec);
                float s1 = s0;
                if (FMT == NVFP4 && ne == E)
                    s1 = mx_block_scale<FMT>(scales, e0 / 16 + 1, c, cdiv, cp4, swizzled, dec);
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    const u32 code = (raw[k].v[i / 8] >> (4 * (i % 8))) & 0xfu;
                    f[i] = mul_rn(e2m1_decode(code), FMT == NVFP4 && i >= 16 ? s1 : s0);
                }
            } else {
                const float s0 = mx_block_scale<FMT>(scales, e0 / 32, c, cdiv, cp4, swizzled, dec);
                decode_vec<CodeE4M3, 16>(*reinterpret_cast<const Vec<u8, 16>*>(&raw[k]), f);
#pragma unroll
                for (int i = 0; i < E; ++i) f[i] = mul_rn(f[i], s0);
            }
            Tout* o = out + e0;
#pragma unroll
            for (int j = 0; j < E / OV; ++j)
                if (j * OV < ne) store_vec<Tout, OV>(o + j * OV, convert_vec<Tout, OV>(f + j * OV));
        }
    }
}

}  // namespace cq
