// quantize_mx: MXFP8, MXFP4 and NVFP4 quantization in one launch.
#pragma once
#include "microscaling/formats.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// x [M, K] is read as nvec vectors of VEC elements (16 bytes; ALIGNED false: element by
// element, for inputs that are not 16-byte aligned). A block of the format is LPB = BLOCK /
// VEC consecutive lanes, which reduce its amax by shuffles. A warp takes tiles of 32 * U
// vectors (U loads in flight a thread), every nwarps-th tile. Each element is read once,
// except NVFP4's tensor amax (GRID_AMAX): the first pass reduces it over the grid (a
// co-resident grid, the handshake of common/reduce.cuh in the stream's zeroed workspace
// ws), keeping each warp's first tile on chip, and the second reads the rest again, the
// newest first, so that what is still in L2 is used.
// U vectors a lane in flight; blocks a multiprocessor the registers are bounded for (the
// generator's state, and the tensor-amax pass's first tile kept on chip, need more).
template <int ROUND, bool GRID_AMAX> struct MxQuantShape {
    static constexpr int U = 4;
    static constexpr int MIN_BLOCKS = ROUND == MX_PHILOX || GRID_AMAX ? 3 : 4;
};

struct MxArgs {
    float inv_max;   // f32(1/448) or f32(1/6)
    int mode;        // MxScaleMode (E8M0 formats)
    float factor;    // NVFP4: f32(S_enc * C(1/6))
    float dec;       // NVFP4: S_dec
};

template <typename Tin, int VEC, bool ALIGNED>
__device__ __forceinline__ Vec<Tin, VEC> load_elements(const Tin* p) {
    if constexpr (ALIGNED) {
        return load_vec<Tin, VEC>(p);
    } else {
        Vec<Tin, VEC> r;
#pragma unroll
        for (int i = 0; i < VEC; ++i) r.v[i] = p[i];
        return r;
    }
}

// The random words of elements e .. e + VEC - 1.
template <int VEC, bool ALIGNED, int ROUND>
__device__ __forceinline__ void random_words(u32* w, i64 e, const u32* __restrict__ rbits,
                                             u32 seed_lo, u32 seed_hi) {
    if constexpr (ROUND == MX_RBITS) {
        if constexpr (ALIGNED && VEC % 4 == 0) {
#pragma unroll
            for (int k = 0; k < VEC / 4; ++k) {
                const Vec<u32, 4> r = load_vec<u32, 4>(rbits + e + 4 * k);
#pragma unroll
                for (int i = 0; i < 4; ++i) w[4 * k + i] = r.v[i];
            }
        } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) w[i] = rbits[e + i];
        }
    } else if constexpr (ROUND == MX_PHILOX) {
        if constexpr (VEC % 4 == 0) {   // e is a multiple of 4: whole Philox blocks
#pragma unroll
            for (int k = 0; k < VEC / 4; ++k) {
                const Words4 b = philox_block((u64)(e >> 2) + k, seed_lo, seed_hi);
#pragma unroll
                for (int i = 0; i < 4; ++i) w[4 * k + i] = b.w[i];
            }
        } else {   // VEC == 2: half a block
            const Words4 b = philox_block((u64)(e >> 2), seed_lo, seed_hi);
            const bool upper = (e & 2) != 0;
            w[0] = upper ? b.w[2] : b.w[0];
            w[1] = upper ? b.w[3] : b.w[1];
        }
    }
}

// Quantizes one vector (elements e ..) against its block's amax bits; lane `first` of the
// block stores the scale byte at sidx.
template <typename Tin, int FMT, int VEC, bool ALIGNED, int ROUND>
__device__ __forceinline__ void quantize_mx_vec(const Vec<Tin, VEC>& x, u32 amax, i64 e,
                                                u8* __restrict__ q, u8* __restrict__ scales,
                                                i64 sidx, bool first, const MxArgs& a,
                                                const u32* __restrict__ rbits, u32 seed_lo,
                                                u32 seed_hi) {
    u32 sb;
    float mul;
    if constexpr (FMT == NVFP4) {
        sb = nv_scale_byte(amax, a.factor);
        mul = nv_inverse(sb, a.dec);
    } else {
        sb = e8m0_byte<FMT>(amax, a.mode, a.inv_max);
        mul = e8m0_inverse(sb);
    }
    if (first) scales[sidx] = (u8)sb;
    float f[VEC];
    unpack<Tin, VEC>(x, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = mul_rn(f[i], mul);
    if constexpr (FMT == MXFP8) {
        store_code_vec<CodeE4M3, VEC>(q + e, encode_vec<CodeE4M3, VEC>(f));
    } else {
        u32 packed = 0;
        if constexpr (ROUND == MX_NEAREST) {
            // The sign of each quotient (x's: the multiplier is positive or NaN) into bit 3 of
            // its nibble, the magnitude's code below it.
#pragma unroll
            for (int i = 0; i < VEC; ++i)
                packed |= (e2m1_magnitude(f[i]) << (4 * i)) | ((f2u(f[i]) >> (28 - 4 * i)) & (8u << (4 * i)));
        } else {
            u32 w[VEC];
            random_words<VEC, ALIGNED, ROUND>(w, e, rbits, seed_lo, seed_hi);
#pragma unroll
            for (int i = 0; i < VEC; ++i) packed |= e2m1_stochastic(f[i], w[i]) << (4 * i);
        }
        // A quotient is NaN only where the block's multiplier is (a NaN element makes the
        // block's scale NaN, an infinity times a finite multiplier stays infinite): then the
        // whole vector's codes are 0.
        if (is_nan(mul)) packed = 0;
        u8* out = q + (e >> 1);
        if constexpr (VEC == 8) {
            *reinterpret_cast<u32*>(out) = packed;
        } else if constexpr (VEC == 4) {
            *reinterpret_cast<u16*>(out) = (u16)packed;
        } else {
            *out = (u8)packed;
        }
    }
}

template <typename Tin, int FMT, int VEC, bool ALIGNED, int ROUND, bool GRID_AMAX>
__global__ void __launch_bounds__(256, MxQuantShape<ROUND, GRID_AMAX>::MIN_BLOCKS)
quantize_mx(const Tin* __restrict__ x, u8* __restrict__ q, u8* __restrict__ scales,
            float* __restrict__ amax_out, const u32* __restrict__ rbits,
            const float* __restrict__ amax_in, u32* __restrict__ ws, i64 nvec, i64 m, i64 c,
            u32 c_magic, u32 c_shift, i64 cp4, int mode, int swizzled, float inv_max,
            float amax_value, u32 seed_lo, u32 seed_hi) {
    constexpr int THREADS = 256, BLOCK = MxTraits<FMT>::BLOCK, LPB = BLOCK / VEC;
    constexpr int U = MxQuantShape<ROUND, GRID_AMAX>::U, TILE = 32 * U;
    static_assert(LPB >= 1 && LPB <= 32 && BLOCK % VEC == 0, "a block is whole lanes");
    __shared__ u32 scratch[THREADS / 32 + 1];
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * THREADS + threadIdx.x) >> 5;
    const i64 nwarps = (i64)gridDim.x * (THREADS / 32);
    const i64 ntiles = (nvec + TILE - 1) / TILE;
    const FastDiv cdiv{c, c_magic, c_shift};

    MxArgs a;
    a.inv_max = inv_max;
    a.mode = mode;
    a.factor = a.dec = 0.0f;
    Vec<Tin, VEC> cache[U];
    if constexpr (FMT == NVFP4) {
        float amax;
        if constexpr (GRID_AMAX) {
            AbsMax<Tin> acc;
            for (i64 t = warp; t < ntiles; t += nwarps) {
                Vec<Tin, VEC> tmp[U];
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const i64 v = t * TILE + j * 32 + lane;
                    if (v < nvec) tmp[j] = load_elements<Tin, VEC, ALIGNED>(x + v * VEC);
                }
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    if (t * TILE + j * 32 + lane < nvec) acc.add(tmp[j]);
                    if (t == warp) cache[j] = tmp[j];
                }
            }
            u32 bits = group_max<THREADS>(acc.bits(), scratch);
            bits = grid_max(bits, ws, &scratch[THREADS / 32]);
            amax = u2f(bits);
        } else {
            amax = amax_in != nullptr ? *amax_in : amax_value;
        }
        if (amax_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) amax_out[0] = amax;
        const NvGlobal g = nv_global(amax);
        a.factor = mul_rn(g.enc, inv_max);
        a.dec = g.dec;
    }

    auto tile = [&](i64 t, bool cached) {
        Vec<Tin, VEC> val[U];
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const i64 v = t * TILE + j * 32 + lane;
            if (cached) {
                val[j] = cache[j];
            } else if (v < nvec) {
                val[j] = load_elements<Tin, VEC, ALIGNED>(x + v * VEC);
            }
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const i64 v = t * TILE + j * 32 + lane;
            const bool live = v < nvec;
            AbsMax<Tin> acc;
            if (live) acc.add(val[j]);
            const u32 amax = lanes_max<LPB>(acc.bits());   // every lane takes part
            if (live) {
                const i64 blk = v / LPB;
                i64 sidx = blk;
                if (swizzled) {
                    const i64 r = cdiv.div(blk);
                    sidx = swizzled_index(r, blk - r * c, cp4);
                }
                quantize_mx_vec<Tin, FMT, VEC, ALIGNED, ROUND>(val[j], amax, v * VEC, q, scales, sidx,
                                                               lane % LPB == 0, a, rbits, seed_lo,
                                                               seed_hi);
            }
        }
    };

    if constexpr (FMT == NVFP4 && GRID_AMAX) {
        if (warp < ntiles) {
            const i64 last = warp + ((ntiles - 1 - warp) / nwarps) * nwarps;
            for (i64 t = last; t > warp; t -= nwarps) tile(t, false);
            tile(warp, true);
        }
    } else {
        for (i64 t = warp; t < ntiles; t += nwarps) tile(t, false);
    }
    if (swizzled) zero_swizzle_padding(scales, m, c, cp4);
}

}  // namespace cq
