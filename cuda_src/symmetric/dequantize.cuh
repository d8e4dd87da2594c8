// dequantize_scaled: codes times the scale of their tensor, row, group or tile.
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Dequantization of an [rows, K] code matrix (K % VEC == 0). MODE says where an element's
// scale is: TENSOR scale[0]; ROW scale[r * srs]; GROUP scale[r * srs + (c >> shift) * scs];
// TILE scale[(r >> 7) * srs + (c >> 7) * scs]. x = Tout(f32(code) * scale), the product
// rounded once to float32.
enum ScaleMode { PER_TENSOR = 0, PER_ROW = 1, PER_GROUP = 2, PER_TILE = 3 };

// UNROLL vectors are in flight per thread, a grid apart: 2 keep enough loads in flight
// without the registers of 4 or 8; 1 where one scale serves the whole tensor.
template <typename Code, typename Tout, int VEC, int MODE, int UNROLL>
__global__ void __launch_bounds__(256)
dequantize_scaled(const typename Code::T* __restrict__ q, const float* __restrict__ scale,
                  Tout* __restrict__ out, i64 rows, i64 kv, u32 kv_magic, u32 kv_shift,
                  i64 col_shift, i64 srs, i64 scs) {
    typedef typename Code::T CodeT;
    constexpr int THREADS = 256, CHUNK = THREADS * UNROLL;
    const FastDiv kd{kv, kv_magic, kv_shift};
    const i64 nvec = rows * kv;
    const float s0 = MODE == PER_TENSOR ? scale[0] : 0.0f;
    const i64 step = (i64)gridDim.x * THREADS;
    const i64 first = (i64)blockIdx.x * THREADS + threadIdx.x;
    for (i64 c0 = first; c0 < nvec; c0 += (i64)gridDim.x * CHUNK) {
        Vec<CodeT, VEC> codes[UNROLL];
        float s[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c0 + k * step;
            if (v < nvec) {
                if constexpr (IsSame<Code, CodeInt8>::value) {
                    codes[k] = load_stream<CodeT, VEC>(q + v * VEC);  // the scales stay in L1
                } else {
                    codes[k] = load_vec<CodeT, VEC>(q + v * VEC);
                }
                if constexpr (MODE == PER_TENSOR) {
                    s[k] = s0;
                } else {
                    const i64 r = kd.div(v);
                    if constexpr (MODE == PER_ROW) {
                        s[k] = scale[r * srs];
                    } else {
                        const i64 c = (v - r * kv) * VEC;
                        s[k] = MODE == PER_GROUP ? scale[r * srs + (c >> col_shift) * scs]
                                                 : scale[(r >> 7) * srs + (c >> 7) * scs];
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = c0 + k * step;
            if (v < nvec) {
                float f[VEC];
                decode_vec<Code, VEC>(codes[k], f);
#pragma unroll
                for (int i = 0; i < VEC; ++i) f[i] = mul_rn(f[i], s[k]);
                store_vec<Tout, VEC>(out + v * VEC, convert_vec<Tout, VEC>(f));
            }
        }
    }
}

}  // namespace cq
