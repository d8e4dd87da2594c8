// dequantize_batched: many tensors of DeepSpeed's format, one launch.
#pragma once
#include "groups/dequantize.cuh"

namespace cq {

// ---------------------------------------------------------------------------------------
// Batched dequantization. The host writes one BatchItem per tensor (int64 words, in this
// order) into a BatchTable passed by value as the kernel's argument (nothing is copied to the
// device, so a launch can be captured in a CUDA graph), and the blocks of its tensors form one grid: block b serves the last item whose
// block_start <= b. An item has ceil(units / (DQ_THREADS * BATCH_UNROLL * BATCH_ROUNDS))
// blocks, and a thread's units are those blocks' width apart, as in dequantize_groups.
// A block finds its item with a binary search over the table (dependent loads), so each
// takes BATCH_ROUNDS rounds of BATCH_UNROLL units a thread to amortize it. Fewer rounds
// leave the search a larger share of each block's work; many more leave fewer blocks than
// the device holds at once for a batch of tensors of a few MB.

constexpr int BATCH_UNROLL = 2;   // units a thread a round, as dequantize_groups for this format
constexpr int BATCH_ROUNDS = 8;   // also BATCH_ROUNDS in cuquant/_cuda/groups.py

constexpr int BATCH_ITEMS = 63;  // items a launch: the table fills at most 4 KB of arguments

struct BatchItem {
    const u8* q;
    const float* params;
    void* out;
    i64 n_units;      // units of VEC elements (16 bytes of output on the fast path, else 1 or 2)
    i64 d;            // divisor: units per group (fast path) or G (general path)
    i64 block_start;  // first block of this item
    u64 magic_shift;  // FastDiv magic (low word) and shift (high word) of d
    i64 kind;         // bit 0: 4-bit codes, bit 1: symmetric, bit 2: fast path
};

struct BatchTable {
    BatchItem items[BATCH_ITEMS];
    int n_items;
};

template <typename Tout, int BITS, bool SYM>
__device__ __forceinline__ void batched_item(const BatchItem& it, bool fast, i64 first, i64 step,
                                             const FastDiv& div) {
    typedef DeepSpeedCodes<BITS, SYM> D;
    Tout* out = static_cast<Tout*>(it.out);
    for (i64 u = first; u < it.n_units; u += step * BATCH_UNROLL) {
        if (fast) {
            dequant_units<D, Tout, 16 / sizeof(Tout), BATCH_UNROLL>(it.q, it.params, nullptr, out,
                                                                 u, step, it.n_units, div);
        } else {
            dequant_units<D, Tout, BITS == 4 ? 2 : 1, BATCH_UNROLL>(it.q, it.params, nullptr, out,
                                                                 u, step, it.n_units, div);
        }
    }
}

template <typename Tout>
__global__ void __launch_bounds__(DQ_THREADS)
dequantize_batched(const __grid_constant__ BatchTable table) {
    const BatchItem* items = table.items;  // read in place: the argument is never copied
    int lo = 0, hi = table.n_items - 1;
    const i64 b = blockIdx.x;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (items[mid].block_start <= b) lo = mid; else hi = mid - 1;
    }
    const BatchItem it = items[lo];
    const FastDiv div{it.d, (u32)(it.magic_shift & 0xffffffffu), (u32)(it.magic_shift >> 32)};
    constexpr i64 TILE = (i64)DQ_THREADS * BATCH_UNROLL * BATCH_ROUNDS;
    const i64 blocks = (it.n_units + TILE - 1) / TILE;
    const i64 first = (b - it.block_start) * DQ_THREADS + threadIdx.x, step = blocks * DQ_THREADS;
    const bool fast = (it.kind & 4) != 0;
    switch (it.kind & 3) {
        case 0: batched_item<Tout, 8, false>(it, fast, first, step, div); break;
        case 1: batched_item<Tout, 4, false>(it, fast, first, step, div); break;
        case 2: batched_item<Tout, 8, true>(it, fast, first, step, div); break;
        default: batched_item<Tout, 4, true>(it, fast, first, step, div); break;
    }
}

}  // namespace cq
