// quantize_mx: MXFP8, MXFP4 and NVFP4 quantization in one launch.
#pragma once
#include "microscaling/formats.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// x [M, K] is read in chunks of CE = VPL * VEC elements, VPL vectors of 16 bytes a lane
// (ALIGNED false: element by element, for inputs that are not 16-byte aligned). A block of
// the format is LPB = BLOCK / CE consecutive lanes (one for NVFP4's 16-bit inputs and
// MXFP4's below), which reduce its amax by shuffles; holding two vectors a lane or more
// divides what each element pays for its block's scale. A warp takes tiles of 32 * U
// chunks (U * VPL loads in flight a lane), every nwarps-th tile. Each element is read
// once, except NVFP4's tensor amax (GRID_AMAX): the first pass reduces it over the grid
// (a co-resident grid, the handshake of common/reduce.cuh in the stream's zeroed workspace
// ws), keeping each warp's first tile on chip, and the second reads the rest again, the
// newest first, so that what is still in L2 is used. An NVFP4 block builds the table of
// nv_inverse once and then takes many tiles (the host sizes the grid: co-resident for the
// tensor amax, a few waves for a given one, so that blocks start at different times and
// one's table is built while the others' loads run).
// MXFP4 from 16-byte vectors holds a whole block a lane (VPL = 4, U = 1: the same loads in
// flight): no shuffle, and one scale and one 16-byte store of codes a block. Stochastic
// rounding takes a chunk a lane (U = 1): its random words are read (rbits) or made
// (Philox) beside its loads, before anything waits on them. Blocks a multiprocessor the
// registers are bounded for: MXFP4's Philox words for a whole block, and the tensor-amax
// pass's first tile kept on chip, need more. The host mirrors VPL and U (_shape in
// cuquant/_cuda/microscaling.py).
template <int FMT, int VEC, int ROUND, bool GRID_AMAX> struct MxQuantShape {
    static constexpr bool WHOLE = FMT == MXFP4 && VEC == 8 && ROUND != MX_RBITS;
    static constexpr int U = WHOLE || ROUND != MX_NEAREST ? 1 : 2, VPL = WHOLE ? 4 : 2;
    static constexpr int MIN_BLOCKS = (GRID_AMAX && ROUND == MX_NEAREST) || (WHOLE && ROUND == MX_PHILOX) ? 3 : 4;
};

struct MxArgs {
    float inv_max;   // f32(1/448) or f32(1/6)
    int mode;        // MxScaleMode (E8M0 formats)
    float factor;    // NVFP4: f32(S_enc * C(1/6))
    const float* inverse;   // NVFP4: nv_inverse of every scale byte (shared memory)
};

// VPL consecutive vectors.
template <typename Tin, int VEC, int VPL>
struct Chunk {
    Vec<Tin, VEC> v[VPL];
};

template <typename Tin, int VEC, int VPL, bool ALIGNED>
__device__ __forceinline__ Chunk<Tin, VEC, VPL> load_chunk(const Tin* p) {
    Chunk<Tin, VEC, VPL> c;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
        if constexpr (ALIGNED) {
            c.v[k] = load_vec<Tin, VEC>(p + k * VEC);
        } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) c.v[k].v[i] = p[k * VEC + i];
        }
    }
    return c;
}

// The random words of elements e .. e + CE - 1 (CE and e multiples of 4).
template <int CE, bool ALIGNED, int ROUND>
__device__ __forceinline__ void random_words(u32* w, i64 e, const u32* __restrict__ rbits,
                                             u32 seed_lo, u32 seed_hi) {
    static_assert(CE % 4 == 0, "whole Philox blocks, whole 16-byte words");
    if constexpr (ROUND == MX_RBITS) {
#pragma unroll
        for (int k = 0; k < CE / 4; ++k) {
            if constexpr (ALIGNED) {
                const Vec<u32, 4> r = load_vec<u32, 4>(rbits + e + 4 * k);
#pragma unroll
                for (int i = 0; i < 4; ++i) w[4 * k + i] = r.v[i];
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) w[4 * k + i] = rbits[e + 4 * k + i];
            }
        }
    } else if constexpr (ROUND == MX_PHILOX) {
#pragma unroll
        for (int k = 0; k < CE / 4; ++k) {
            const Words4 b = philox_block((u64)(e >> 2) + k, seed_lo, seed_hi);
#pragma unroll
            for (int i = 0; i < 4; ++i) w[4 * k + i] = b.w[i];
        }
    }
}

// The e2m1 codes of CE quotients rounded to nearest, packed two a byte (element 2i low), as
// CE / 8 words, or for CE == 4 one 16-bit word in words[0].
template <typename Tin, int FMT, int CE>
__device__ __forceinline__ void e2m1_words(const float* f, u32* words) {
    constexpr int NW = CE >= 8 ? CE / 8 : 1;
    if constexpr (FMT == MXFP4 && sizeof(Tin) == 2) {
        // Two codes at once on float16 pairs (e2m1_magnitude_x2): the pair's signs (bits
        // 15 and 31) shifted to bits 3 and 19 beside the codes, then the high half's
        // nibble folded down to bits 4-7.
        u32 bytes[CE / 2];
#pragma unroll
        for (int k = 0; k < CE / 2; ++k) {
            const u32 h = pack_pair<half>(f[2 * k], f[2 * k + 1]);
            const u32 c = e2m1_magnitude_x2(h) | ((h >> 12) & 0x00080008u);
            bytes[k] = c | (c >> 12);
        }
        if constexpr (CE >= 8) {
#pragma unroll
            for (int w = 0; w < NW; ++w)
                words[w] = pack_bytes(bytes[4 * w], bytes[4 * w + 1], bytes[4 * w + 2], bytes[4 * w + 3]);
        } else {
            words[0] = prmt(bytes[0], bytes[1], 0x0040u);
        }
    } else {
        // The sign of each quotient (x's, flipped where the multiplier is negative) into bit
        // 3 of its nibble, the magnitude's code below it.
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            u32 packed = 0;
#pragma unroll
            for (int i = 0; i < (CE < 8 ? CE : 8); ++i) {
                const float v = f[8 * w + i];
                packed |= (e2m1_magnitude(v) << (4 * i)) | ((f2u(v) >> (28 - 4 * i)) & (8u << (4 * i)));
            }
            words[w] = packed;
        }
    }
}

// Stores a chunk's packed e2m1 codes (CE / 8 words, or for CE == 4 one 16-bit word) at
// element e, all 0 where the block's multiplier is NaN (a NaN element makes the block's
// scale NaN; an infinity times a finite multiplier stays infinite).
template <int CE>
__device__ __forceinline__ void store_e2m1(u8* __restrict__ q, i64 e, const u32* words, bool nan) {
    u8* out = q + (e >> 1);
    if constexpr (CE >= 8) {
        constexpr int NW = CE / 8;
        Vec<u32, NW> o;
#pragma unroll
        for (int w = 0; w < NW; ++w) o.v[w] = nan ? 0u : words[w];
        store_vec<u32, NW>(reinterpret_cast<u32*>(out), o);
    } else {
        *reinterpret_cast<u16*>(out) = nan ? (u16)0 : (u16)words[0];
    }
}

// Quantizes one chunk (elements e .. e + CE - 1) against its block's amax bits; lane
// `first` of the block stores the scale byte at sidx; r: the chunk's random words.
template <typename Tin, int FMT, int VEC, int VPL, int ROUND>
__device__ __forceinline__ void quantize_mx_chunk(const Chunk<Tin, VEC, VPL>& x, u32 amax, i64 e,
                                                  u8* __restrict__ q, u8* __restrict__ scales,
                                                  i64 sidx, bool first, const MxArgs& a,
                                                  const u32* r) {
    constexpr int CE = VEC * VPL;
    u32 sb;
    float mul;
    if constexpr (FMT == NVFP4) {
        sb = nv_scale_byte(amax, a.factor);
        mul = a.inverse[sb];   // a division and a decode a block, done once a launch
    } else {
        sb = e8m0_byte<FMT>(amax, a.mode, a.inv_max);
        mul = e8m0_inverse(sb);
    }
    if (first) scales[sidx] = (u8)sb;
    if constexpr (FMT != MXFP8 && ROUND == MX_NEAREST && sizeof(Tin) == 2 && CE % 8 == 0) {
        // Eight elements a word of codes, the signs from x's own bits by byte permutes. A
        // quotient's sign is x's, flipped where the multiplier is negative (an NVFP4
        // global amax below zero); NaN multipliers zero the chunk below.
        constexpr int NW = CE / 8;
        const u32* xw = reinterpret_cast<const u32*>(&x);
        const u32 flip = (f2u(mul) >> 31) * 0x88888888u;
        u32 words[NW];
        if constexpr (FMT == MXFP4 && IsSame<Tin, bfloat16>::value) {
            // 2**(127 - b) as a bfloat16 pair (b = 254: subnormal; 255 is NaN, zeroed below).
            const u32 inv16 = sb == 254u ? 0x0040u : ((254u - sb) << 7) & 0x7fffu;
            const u32 inv2 = inv16 * 0x00010001u;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                u32 half16[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // Elements 0-3 of the half: pairs (0, 1) and (2, 3) to nibbles 0-3.
                    const u32 c0 = e2m1_magnitude_bf16x2(xw[4 * w + 2 * h], inv2);
                    const u32 c1 = e2m1_magnitude_bf16x2(xw[4 * w + 2 * h + 1], inv2);
                    const u32 t = c0 + (c1 << 8);   // codes 0, 2, 1, 3 in bytes 0-3
                    half16[h] = t + (t >> 12);
                }
                words[w] = prmt(half16[0], half16[1], 0x5410u) | e2m1_signs8(xw + 4 * w);
            }
        } else {
            float f[CE];
#pragma unroll
            for (int k = 0; k < VPL; ++k) unpack<Tin, VEC>(x.v[k], f + k * VEC);
#pragma unroll
            for (int i = 0; i < CE; ++i) f[i] = mul_rn(f[i], mul);
#pragma unroll
            for (int w = 0; w < NW; ++w)
                words[w] = e2m1_magnitudes8(f + 8 * w) | (e2m1_signs8(xw + 4 * w) ^ flip);
        }
        store_e2m1<CE>(q, e, words, is_nan(mul));
        return;
    }
    if constexpr (FMT != MXFP8 && ROUND != MX_NEAREST) {
        // Stochastic, from the chunk's random words r: the magnitudes of |x| * |multiplier|,
        // the signs x's (eight a word by byte permutes from 16-bit inputs), flipped where the
        // multiplier is negative (an NVFP4 global amax below zero).
        constexpr int NW = CE >= 8 ? CE / 8 : 1, PER = CE < 8 ? CE : 8;
        float f[CE];
#pragma unroll
        for (int k = 0; k < VPL; ++k) unpack<Tin, VEC>(x.v[k], f + k * VEC);
        const float amul = u2f(f2u(mul) & 0x7fffffffu);
#pragma unroll
        for (int i = 0; i < CE; ++i) f[i] = mul_abs_rn(f[i], amul);
        const u32 flip = (f2u(mul) >> 31) * 0x88888888u;
        u32 words[NW];
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            u32 signs = 0;
            if constexpr (sizeof(Tin) == 2 && PER == 8) {
                signs = e2m1_signs8(reinterpret_cast<const u32*>(&x) + 4 * w);
            } else {
#pragma unroll
                for (int i = 0; i < PER; ++i)
                    signs |= (sign_bit(x.v[(8 * w + i) / VEC].v[(8 * w + i) % VEC]) << (4 * i + 3));
            }
            words[w] = e2m1_stochastic_magnitudes<PER>(f + 8 * w, r + 8 * w) | (signs ^ flip);
        }
        store_e2m1<CE>(q, e, words, is_nan(mul));
        return;
    }
    float f[CE];
#pragma unroll
    for (int k = 0; k < VPL; ++k) unpack<Tin, VEC>(x.v[k], f + k * VEC);
#pragma unroll
    for (int i = 0; i < CE; ++i) f[i] = mul_rn(f[i], mul);
    if constexpr (FMT == MXFP8) {
        store_code_vec<CodeE4M3, CE>(q + e, encode_vec<CodeE4M3, CE>(f));
    } else {
        constexpr int NW = CE >= 8 ? CE / 8 : 1;
        u32 words[NW];
        e2m1_words<Tin, FMT, CE>(f, words);
        store_e2m1<CE>(q, e, words, is_nan(mul));
    }
}

template <typename Tin, int FMT, int VEC, bool ALIGNED, int ROUND, bool GRID_AMAX>
__global__ void __launch_bounds__(256, MxQuantShape<FMT, VEC, ROUND, GRID_AMAX>::MIN_BLOCKS)
quantize_mx(const Tin* __restrict__ x, u8* __restrict__ q, u8* __restrict__ scales,
            float* __restrict__ amax_out, const u32* __restrict__ rbits,
            const float* __restrict__ amax_in, u32* __restrict__ ws, i64 nchunks, i64 m, i64 c,
            u32 c_magic, u32 c_shift, i64 cp4, int mode, int swizzled, float inv_max,
            float amax_value, u32 seed_lo, u32 seed_hi) {
    typedef MxQuantShape<FMT, VEC, ROUND, GRID_AMAX> Shape;
    constexpr int THREADS = 256, BLOCK = MxTraits<FMT>::BLOCK, U = Shape::U, VPL = Shape::VPL;
    constexpr int CE = VEC * VPL, LPB = BLOCK / CE, TILE = 32 * U;
    static_assert(LPB >= 1 && LPB <= 32 && BLOCK % CE == 0, "a block is whole lanes");
    typedef Chunk<Tin, VEC, VPL> ChunkT;
    // A given amax's first tile loaded before the table (not with random words: they leave
    // no registers to hold it through the table).
    constexpr bool EARLY = FMT == NVFP4 && !GRID_AMAX && ROUND != MX_RBITS;
    __shared__ u32 scratch[THREADS / 32 + 1];
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * THREADS + threadIdx.x) >> 5;
    const i64 nwarps = (i64)gridDim.x * (THREADS / 32);
    const i64 ntiles = (nchunks + TILE - 1) / TILE;
    const FastDiv cdiv{c, c_magic, c_shift};

    MxArgs a;
    a.inv_max = inv_max;
    a.mode = mode;
    a.factor = 0.0f;
    __shared__ float inverse[FMT == NVFP4 ? THREADS : 1];
    a.inverse = inverse;
    ChunkT cache[U];
    if constexpr (FMT == NVFP4) {
        float amax;
        if constexpr (GRID_AMAX) {
            AbsMax<Tin> acc;
            for (i64 t = warp; t < ntiles; t += nwarps) {
                ChunkT tmp[U];
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const i64 ch = t * TILE + j * 32 + lane;
                    if (ch < nchunks) tmp[j] = load_chunk<Tin, VEC, VPL, ALIGNED>(x + ch * CE);
                }
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    if (t * TILE + j * 32 + lane < nchunks) {
#pragma unroll
                        for (int k = 0; k < VPL; ++k) acc.add(tmp[j].v[k]);
                    }
                    if (t == warp) cache[j] = tmp[j];
                }
            }
            u32 bits = group_max<THREADS>(acc.bits(), scratch);
            bits = grid_max(bits, ws, &scratch[THREADS / 32]);
            amax = u2f(bits);
        } else {
            // The first tile's loads go out before the global scales' divisions, the table
            // and the barrier, which would otherwise hold them back.
            if (EARLY && warp < ntiles) {
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const i64 ch = warp * TILE + j * 32 + lane;
                    if (ch < nchunks) cache[j] = load_chunk<Tin, VEC, VPL, ALIGNED>(x + ch * CE);
                }
            }
            amax = amax_in != nullptr ? *amax_in : amax_value;
        }
        if (amax_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
            amax_out[0] = is_nan(amax) ? u2f(F32_NAN) : amax;   // the canonical NaN
        const NvGlobal g = nv_global(amax);
        a.factor = mul_rn(g.enc, inv_max);
        inverse[threadIdx.x] = nv_inverse(threadIdx.x, g.dec);   // THREADS == 256 bytes
        __syncthreads();
    }

    auto load = [&](i64 t, ChunkT (&val)[U]) {
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const i64 ch = t * TILE + j * 32 + lane;
            if (ch < nchunks) val[j] = load_chunk<Tin, VEC, VPL, ALIGNED>(x + ch * CE);
        }
    };
    // Quantizes tile t from val (loaded, or in flight: the random words are read or made
    // beside those loads, before anything waits on them).
    auto tile = [&](i64 t, const ChunkT (&val)[U]) {
        u32 rw[U][ROUND == MX_NEAREST ? 1 : CE];
        if constexpr (ROUND != MX_NEAREST) {
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const i64 ch = t * TILE + j * 32 + lane;
                if (ch < nchunks) random_words<CE, ALIGNED, ROUND>(rw[j], ch * CE, rbits, seed_lo, seed_hi);
            }
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const i64 ch = t * TILE + j * 32 + lane;
            const bool live = ch < nchunks;
            AbsMax<Tin> acc;
            if (live) {
#pragma unroll
                for (int k = 0; k < VPL; ++k) acc.add(val[j].v[k]);
            }
            const u32 amax = lanes_max<LPB>(acc.bits());   // every lane takes part
            if (live) {
                const i64 blk = ch / LPB;
                i64 sidx = blk;
                if (swizzled) {
                    const i64 r = cdiv.div(blk);
                    sidx = swizzled_index(r, blk - r * c, cp4);
                }
                quantize_mx_chunk<Tin, FMT, VEC, VPL, ROUND>(val[j], amax, ch * CE, q, scales, sidx,
                                                             lane % LPB == 0, a, rw[j]);
            }
        }
    };

    if constexpr (FMT == NVFP4 && GRID_AMAX) {
        if (warp < ntiles) {
            const i64 last = warp + ((ntiles - 1 - warp) / nwarps) * nwarps;
            for (i64 t = last; t > warp; t -= nwarps) {
                ChunkT val[U];
                load(t, val);
                tile(t, val);
            }
            tile(warp, cache);
        }
    } else if constexpr (EARLY) {
        if (warp < ntiles) {
            tile(warp, cache);
            for (i64 t = warp + nwarps; t < ntiles; t += nwarps) {
                ChunkT val[U];
                load(t, val);
                tile(t, val);
            }
        }
    } else {
        for (i64 t = warp; t < ntiles; t += nwarps) {
            ChunkT val[U];
            load(t, val);
            tile(t, val);
        }
    }
    if (swizzled) zero_swizzle_padding(scales, m, c, cp4);
}

}  // namespace cq
