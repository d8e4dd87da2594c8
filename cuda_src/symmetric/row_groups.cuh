// quantize_row_groups: groups of G elements of each row, held in registers.
#pragma once
#include "common.cuh"
#include "symmetric/quantize_vec.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Row groups. The input is [rows, K]; each row is cut into groups of G elements (the last
// may be shorter). A run of TPG threads owns one group, each thread VPT vectors of it,
// held in registers; the grid covers the groups once (a grid-stride loop covers the rest
// of very large inputs). VPT == 0 streams groups too long to hold (two reads). SMOOTH
// divides x by smooth[k] first (G must then be K). TS is the scale's stored type: a 16-bit
// TS rounds each scale to it (nearest even) and the codes are computed against the scale
// as stored, so that a reader multiplying by it gets exactly the dequantized values.
template <typename Tin, typename Code, int RULE, int VEC, int TPG, int VPT, bool SMOOTH, typename TS = float>
__global__ void __launch_bounds__(RowGroupShape<TPG, VPT, SMOOTH>::threads,
                                  RowGroupShape<TPG, VPT, SMOOTH>::min_blocks)
quantize_row_groups(const Tin* __restrict__ x, typename Code::T* __restrict__ q,
                    TS* __restrict__ scale, const float* __restrict__ smooth,
                    i64 rows, i64 K, i64 G, i64 groups_per_row, u32 gpr_magic, u32 gpr_shift,
                    i64 scale_row_stride, i64 scale_group_stride, i64 scale_pad_rows,
                    float inv_qmax, float eps) {
    typedef typename Code::T CodeT;
    typedef typename Conditional<SMOOTH, float, Tin>::type Tv;   // what is quantized
    constexpr int THREADS = RowGroupShape<TPG, VPT, SMOOTH>::threads, SLOTS = THREADS / TPG;
    constexpr int NV = VPT > 0 ? VPT : 1;
    __shared__ u32 scratch[THREADS / 32];
    const int lane = threadIdx.x % TPG, slot = threadIdx.x / TPG;
    const FastDiv gdiv{groups_per_row, gpr_magic, gpr_shift};
    const i64 total = rows * groups_per_row;
    const u32 eps_bits = f2u(eps);

    for (i64 base = (i64)blockIdx.x * SLOTS; base < total; base += (i64)gridDim.x * SLOTS) {
        const i64 gid = base + slot;
        const bool live = gid < total;
        const i64 r = live ? gdiv.div(gid) : 0;
        const i64 g = gid - r * groups_per_row;
        const i64 start = g * G;
        const Tin* xg = x + (r * K + start);
        CodeT* qg = q + (r * K + start);
        const i64 len = live ? (K - start < G ? K - start : G) : 0;
        auto stream_load = [&](i64 e) { return load_group_vec<Tin, VEC, SMOOTH>(xg + e, smooth + e); };

        u32 amax;
        Vec<Tv, VEC> val[NV];
        if constexpr (VPT > 0) {
            // A held group is at most 65536 elements: 32-bit offsets within it.
            const int hlen = (int)len;
            Vec<Tin, VEC> raw[NV];
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int e = (lane + j * TPG) * VEC;
                if (e < hlen) raw[j] = load_vec<Tin, VEC>(xg + e);
            }
            AbsMax<Tv> acc;
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int e = (lane + j * TPG) * VEC;
                if (e < hlen) {
                    if constexpr (SMOOTH) {
                        val[j] = smooth_vec<Tin, VEC>(raw[j], load_vec<float, VEC>(smooth + e).v);
                    } else {
                        val[j] = raw[j];
                    }
                    acc.add(val[j]);
                }
            }
            amax = group_max<TPG>(acc.bits(), scratch);
        } else {
            // Streamed: the group is read twice (the second read mostly hits L2).
            AbsMax<Tv> acc;
            for_each_streamed<4, TPG, VEC>(len, lane, stream_load,
                                           [&](const Vec<Tv, VEC>& v, i64) { acc.add(v); });
            amax = group_max<TPG>(acc.bits(), scratch);
        }

        constexpr bool ROUNDED = !IsSame<TS, float>::value;
        const float s = to_f32(from_f32<TS>(scale_from_amax<RULE>(amax, inv_qmax, eps_bits)));
        if (len > 0 && lane == 0) {
            const i64 sidx = r * scale_row_stride + g * scale_group_stride;
            scale[sidx] = from_f32<TS>(s);
            if (r == rows - 1) {  // the column layout's padding rows
#pragma unroll 1
                for (i64 p = 1; p <= scale_pad_rows; ++p) scale[sidx + p * scale_row_stride] = from_f32<TS>(0.0f);
            }
        }
        const DivPlan plan = plan_division(s);
        const int path = div_path<RULE>(plan, amax, eps_bits);
        if constexpr (VPT > 0) {
            store_held_codes<Tv, Code, RULE, VEC, TPG, NV, ROUNDED>(qg, val, (int)len, lane, plan, path);
        } else {
            on_path(path, [&](auto tag) {
                constexpr int P = decltype(tag)::value, CORR = FastCorrections<Tv, RULE>::value;
                for_each_streamed<4, TPG, VEC>(len, lane, stream_load, [&](const Vec<Tv, VEC>& v, i64 e) {
                    store_code_vec<Code, VEC>(qg + e, quantize_vec_on<P, CORR, Tv, Code, VEC, ROUNDED>(v, plan));
                });
            });
        }
    }
}

}  // namespace cq
