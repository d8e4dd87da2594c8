// quantize_tiles: 128x128 tiles (DeepSeek-V3 weight blocks).
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// 128x128 tiles of an [N, K] matrix, edge tiles partial; one block of 256 threads owns a
// tile, held in registers (64 elements a thread), four blocks per multiprocessor; the grid
// covers the tiles once. scale is [tiles_n, tiles_k] row-major. RULE: ZERO_IS_ONE (float32
// scales) or ZERO_IS_ONE_POW2 (UE8M0 scales, the codes against the rounded scale).
template <typename Tin, typename Code, int VEC, int RULE = ZERO_IS_ONE>
__global__ void __launch_bounds__(256, 4)
quantize_tiles(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
               float* __restrict__ scale, i64 N, i64 K, i64 tiles_n, i64 tiles_k, float inv_qmax) {
    constexpr int THREADS = 256, TILE = 128, COLV = TILE / VEC, RPP = THREADS / COLV,
                  PASSES = TILE / RPP;
    __shared__ u32 scratch[THREADS / 32];
    const int cv = threadIdx.x % COLV, r0 = threadIdx.x / COLV;
    for (i64 t = blockIdx.x; t < tiles_n * tiles_k; t += gridDim.x) {
        const i64 tn = t / tiles_k, tk = t - tn * tiles_k;
        const i64 col = tk * TILE + (i64)cv * VEC;
        const bool col_ok = col < K;
        const i64 off = (tn * TILE + r0) * K + col;
        const i64 rows_left = N - tn * TILE - r0;
        Vec<Tin, VEC> buf[PASSES];
#pragma unroll
        for (int p = 0; p < PASSES; ++p)
            if (col_ok && p * RPP < rows_left) buf[p] = load_vec<Tin, VEC>(x + off + (i64)p * RPP * K);
        AbsMax<Tin> acc;
#pragma unroll
        for (int p = 0; p < PASSES; ++p)
            if (col_ok && p * RPP < rows_left) acc.add(buf[p]);
        const u32 amax = group_max<THREADS>(acc.bits(), scratch);
        const float s = scale_from_amax<RULE>(amax, inv_qmax, 0u);
        if (threadIdx.x == 0) scale[t] = s;
        const DivPlan plan = plan_division(s);
        on_path(div_path<RULE>(plan, amax, 0u), [&](auto path) {
            constexpr int P = decltype(path)::value, CORR = FastCorrections<Tin, RULE>::value;
#pragma unroll
            for (int p = 0; p < PASSES; ++p)
                if (col_ok && p * RPP < rows_left)
                    store_code_vec<Code, VEC>(q + off + (i64)p * RPP * K,
                                          quantize_vec_on<P, CORR, Tin, Code, VEC>(buf[p], plan));
        });
    }
}

}  // namespace cq
