// dequantize_mx: MXFP8, MXFP4 and NVFP4 codes back to floats.
#pragma once
#include "microscaling/formats.cuh"

namespace cq {

constexpr int MX_DEQUANT_UNROLL = 4;  // units a thread in flight; DEQUANT_UNROLL in cuquant/_cuda/microscaling.py

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

// A unit is the elements of one 16-byte store of output (8 for 16-bit floats, 4 for
// float32): its codes are 4 or 2 bytes (fp4) or 8 or 4 bytes (MXFP8), so neighbouring
// threads read neighbouring codes and write neighbouring vectors, both coalesced, and a
// unit never straddles a scale block (16 or 32 elements). A thread has UNROLL units in
// flight. ALIGNED false: q is not 16-byte aligned, read byte by byte.
template <int FMT, typename Tout, bool ALIGNED>
__global__ void __launch_bounds__(256)
dequantize_mx(const u8* __restrict__ q, const u8* __restrict__ scales, Tout* __restrict__ out,
              const float* __restrict__ amax_in, i64 nbytes, i64 c, u32 c_magic, u32 c_shift,
              i64 cp4, int swizzled, float amax_value) {
    constexpr int UNROLL = MX_DEQUANT_UNROLL;
    constexpr bool FP4 = MxTraits<FMT>::FP4;
    constexpr int OV = 16 / (int)sizeof(Tout);  // elements a unit
    constexpr int QB = FP4 ? OV / 2 : OV;       // bytes of codes a unit
    const i64 nunits = nbytes / QB;             // rows hold whole blocks: no partial unit
    const FastDiv cdiv{c, c_magic, c_shift};
    float dec = 0.0f;
    if constexpr (FMT == NVFP4) dec = nv_global(amax_in != nullptr ? *amax_in : amax_value).dec;

    const i64 stride = (i64)gridDim.x * blockDim.x * UNROLL;
    for (i64 u0 = (i64)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; u0 < nunits; u0 += stride) {
        Vec<u8, QB> raw[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = u0 + (i64)k * blockDim.x;
            if (u >= nunits) continue;
            const u8* p = q + u * QB;
            if (ALIGNED) {
                raw[k] = load_vec<u8, QB>(p);
            } else {
#pragma unroll
                for (int i = 0; i < QB; ++i) raw[k].v[i] = p[i];
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = u0 + (i64)k * blockDim.x;
            if (u >= nunits) continue;
            const i64 e0 = u * OV;
            const float s = mx_block_scale<FMT>(scales, e0 / MxTraits<FMT>::BLOCK, c, cdiv, cp4,
                                                swizzled, dec);
            float f[OV];
            if constexpr (FP4) {
                u32 w;
                if constexpr (QB == 4) w = *reinterpret_cast<const u32*>(&raw[k]);
                else w = *reinterpret_cast<const u16*>(&raw[k]);
#pragma unroll
                for (int i = 0; i < OV; ++i) f[i] = mul_rn(e2m1_decode((w >> (4 * i)) & 0xfu), s);
            } else {
                decode_vec<CodeE4M3, OV>(raw[k], f);
#pragma unroll
                for (int i = 0; i < OV; ++i) f[i] = mul_rn(f[i], s);
            }
            store_vec<Tout, OV>(out + e0, convert_vec<Tout, OV>(f));
        }
    }
}

}  // namespace cq
