// quantize_tensor: one scale for the whole tensor, in one launch.
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// One scale for the whole tensor (n elements, any shape), in one launch. The grid must be
// co-resident (the host sizes it from the occupancy), ws is a zeroed 3-word workspace that
// the kernel leaves zeroed. Each thread keeps its first CACHE vectors in registers; the
// rest are read again in phase 2, newest first so that what is still in L2 is used.
template <typename Tin, typename Code, int VEC, int CACHE>
__global__ void __launch_bounds__(256, 4)
quantize_tensor(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                float* __restrict__ scale_out, i64 n, u32* __restrict__ ws, float inv_qmax) {
    constexpr int THREADS = 256, UNROLL = 4;
    __shared__ u32 scratch[THREADS / 32 + 1];
    const i64 nvec = n / VEC, tail = n - nvec * VEC;
    const i64 ntiles = (nvec + THREADS - 1) / THREADS;
    const i64 G = gridDim.x, tid = threadIdx.x;

    Vec<Tin, VEC> cache[CACHE];
    AbsMax<Tin> acc;
#pragma unroll
    for (int j = 0; j < CACHE; ++j) {
        const i64 v = ((i64)blockIdx.x + j * G) * THREADS + tid;
        if (v < nvec) cache[j] = load_vec<Tin, VEC>(x + v * VEC);
    }
#pragma unroll
    for (int j = 0; j < CACHE; ++j)
        if (((i64)blockIdx.x + j * G) * THREADS + tid < nvec) acc.add(cache[j]);
    const i64 first = (i64)blockIdx.x + CACHE * G;
    for (i64 t = first; t < ntiles; t += UNROLL * G) {
        Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const i64 v = (t + k * G) * THREADS + tid;
            if (v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k)
            if ((t + k * G) * THREADS + tid < nvec) acc.add(tmp[k]);
    }
    if (blockIdx.x == 0 && tid < tail) acc.add(load_vec<Tin, 1>(x + nvec * VEC + tid));

    u32 amax = group_max<THREADS>(acc.bits(), scratch);
    amax = grid_max(amax, ws, &scratch[THREADS / 32]);
    const float s = scale_from_amax<ZERO_IS_ONE>(amax, inv_qmax, 0u);
    if (blockIdx.x == 0 && tid == 0) scale_out[0] = s;
    const DivPlan p = plan_division(s);
    on_path(div_path<ZERO_IS_ONE>(p, amax, 0u), [&](auto path) {
        constexpr int P = decltype(path)::value, CORR = FastCorrections<Tin, ZERO_IS_ONE>::value;
        if (first < ntiles) {
            const i64 last = first + ((ntiles - 1 - first) / G) * G;
            for (i64 t = last; t >= first; t -= UNROLL * G) {
                Vec<Tin, VEC> tmp[UNROLL];
#pragma unroll
                for (int k = 0; k < UNROLL; ++k) {
                    const i64 tt = t - k * G, v = tt * THREADS + tid;
                    if (tt >= first && v < nvec) tmp[k] = load_vec<Tin, VEC>(x + v * VEC);
                }
#pragma unroll
                for (int k = 0; k < UNROLL; ++k) {
                    const i64 tt = t - k * G, v = tt * THREADS + tid;
                    if (tt >= first && v < nvec)
                        store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_on<P, CORR, Tin, Code, VEC>(tmp[k], p));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < CACHE; ++j) {
            const i64 v = ((i64)blockIdx.x + j * G) * THREADS + tid;
            if (v < nvec) store_code_vec<Code, VEC>(q + v * VEC, quantize_vec_on<P, CORR, Tin, Code, VEC>(cache[j], p));
        }
        if (blockIdx.x == 0 && tid < tail) {
            const i64 i = nvec * VEC + tid;
            store_code_vec<Code, 1>(q + i, quantize_vec_on<P, CORR, Tin, Code, 1>(load_vec<Tin, 1>(x + i), p));
        }
    });
}

}  // namespace cq
