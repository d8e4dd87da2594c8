// dequantize_mx: MXFP8, MXFP4 and NVFP4 codes back to floats.
#pragma once
#include "microscaling/formats.cuh"

namespace cq {

constexpr int MX_DEQUANT_UNROLL = 2;  // units a thread in flight; DEQUANT_UNROLL in cuquant/_cuda/microscaling.py
// Eight blocks a multiprocessor (32 registers a thread): resident warps, not registers,
// hide the latency. A wave of an H200 is 132 x 64 warps; fp4 codes, a byte read for every
// four written, are prefetched into L2 for the warp a wave on, so that its loads wait on L2.
constexpr int MX_DEQUANT_BLOCKS = 8;
constexpr i64 MX_DEQUANT_L2_AHEAD = 132 * MX_DEQUANT_BLOCKS * 8;

// The index of block blk's scale byte in either layout.
__device__ __forceinline__ i64 mx_scale_index(i64 blk, i64 c, const FastDiv& cdiv, i64 cp4,
                                              int swizzled) {
    if (swizzled) {
        const i64 r = cdiv.div(blk);
        return swizzled_index(r, blk - r * c, cp4);
    }
    return blk;
}

// A block's scale as float32 from its byte: 2**(b - 127) for E8M0 scales, f32(f32(s) * S_dec)
// for NVFP4's e4m3 ones.
template <int FMT>
__device__ __forceinline__ float mx_scale_value(u32 b, float dec) {
    if constexpr (FMT == NVFP4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        // The conversion is exact (every e4m3 value is a float16; NaN stays NaN, and the
        // product below is then the canonical NaN as with the bit decoder).
        u32 h2;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)b));
        return mul_rn(to_f32(half{(u16)(h2 & 0xffffu)}), dec);
#else
        return mul_rn(CodeE4M3::decode((u8)b), dec);
#endif
    } else {
        return e8m0_value(b);
    }
}

// A unit is the elements of one 16-byte store of output (8 for 16-bit floats, 4 for
// float32): its codes are 4 or 2 bytes (fp4) or 8 or 4 bytes (MXFP8), so neighbouring
// threads read neighbouring codes and write neighbouring vectors, both coalesced, and a
// unit never straddles a scale block (16 or 32 elements). A warp takes 32 * UNROLL
// consecutive units (round k: base + 32 k + lane), its codes and scale bytes all loaded
// before any is used. ALIGNED false: q is not 16-byte aligned, read byte by byte.
template <int FMT, typename Tout, bool ALIGNED>
__global__ void __launch_bounds__(256, MX_DEQUANT_BLOCKS)
dequantize_mx(const u8* __restrict__ q, const u8* __restrict__ scales, Tout* __restrict__ out,
              const float* __restrict__ amax_in, i64 nbytes, i64 c, u32 c_magic, u32 c_shift,
              i64 cp4, int swizzled, float amax_value) {
    constexpr int UNROLL = MX_DEQUANT_UNROLL, WARPS = 256 / 32, UPW = 32 * UNROLL;
    constexpr bool FP4 = MxTraits<FMT>::FP4;
    constexpr int OV = 16 / (int)sizeof(Tout);  // elements a unit
    constexpr int QB = FP4 ? OV / 2 : OV;       // bytes of codes a unit
    constexpr int UPB = MxTraits<FMT>::BLOCK / OV;   // units a scale block
    const i64 nunits = nbytes / QB;             // rows hold whole blocks: no partial unit
    const FastDiv cdiv{c, c_magic, c_shift};
    const int lane = threadIdx.x & 31;
    // NVFP4's S_dec (a load and two divisions) is worked out after the first codes' loads
    // are issued, so that their latency covers it.
    float dec = 0.0f;
    bool have_dec = false;

    const i64 stride = (i64)gridDim.x * WARPS;
    for (i64 w = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); w * UPW < nunits; w += stride) {
        const i64 base = w * UPW;
        if constexpr (FP4) {
            constexpr int LINES = UPW * QB / 128;
            const i64 at = (base + MX_DEQUANT_L2_AHEAD * UPW) * QB + 128 * lane;
            if (lane < LINES && at < nbytes) prefetch_l2(q + at);
        }
        // A unit's codes as whole words (as bytes the compiler would reassemble them).
        typedef typename Conditional<(QB >= 4), Vec<u32, QB / 4>, Vec<u16, 1>>::type Raw;
        Raw raw[UNROLL];
        u32 sb[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = base + 32 * k + lane;
            if (u >= nunits) continue;
            const u8* p = q + u * QB;
            if (ALIGNED) {
                raw[k] = *reinterpret_cast<const Raw*>(p);
            } else {
                u8* r = reinterpret_cast<u8*>(&raw[k]);
#pragma unroll
                for (int i = 0; i < QB; ++i) r[i] = p[i];
            }
            sb[k] = scales[mx_scale_index((i64)((u64)u / UPB), c, cdiv, cp4, swizzled)];
        }
        if constexpr (FMT == NVFP4) {
            if (!have_dec) {
                dec = nv_global(amax_in != nullptr ? *amax_in : amax_value).dec;
                have_dec = true;
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 u = base + 32 * k + lane;
            if (u >= nunits) continue;
            const float s = mx_scale_value<FMT>(sb[k], dec);
            float f[OV];
            if constexpr (FP4) {
                if constexpr (QB == 4) {
                    u32 h[4];
                    e2m1x8_bf16(*reinterpret_cast<const u32*>(&raw[k]), h);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        f[2 * i] = u2f(h[i] << 16);
                        f[2 * i + 1] = u2f(h[i] & 0xffff0000u);
                    }
                } else {
                    const u32 wd = *reinterpret_cast<const u16*>(&raw[k]);
#pragma unroll
                    for (int i = 0; i < OV; ++i) f[i] = e2m1_decode((wd >> (4 * i)) & 0xfu);
                }
#pragma unroll
                for (int i = 0; i < OV; ++i) f[i] = mul_rn(f[i], s);
            } else {
                decode_vec<CodeE4M3, OV>(*reinterpret_cast<const Vec<u8, OV>*>(&raw[k]), f);
#pragma unroll
                for (int i = 0; i < OV; ++i) f[i] = mul_rn(f[i], s);
            }
            store_vec<Tout, OV>(out + u * OV, convert_vec<Tout, OV>(f));
        }
    }
}

}  // namespace cq
