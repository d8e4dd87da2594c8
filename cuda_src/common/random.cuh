// Counter-based random words: the generator of seeded stochastic rounding (docs/formats.md
// section 6), shared by every format that rounds with it.
#pragma once
#include "common/base.cuh"

namespace cq {

// Philox4x32-10 (Salmon et al., 2011): counter (c0..c3), key (k0, k1). Inlined, so that
// the round keys come from uniform registers and the counter's zero words fold away: about
// 40 instructions a block against 80 and a call.
struct Words4 { u32 w[4]; };

__device__ __forceinline__ Words4 philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#pragma unroll
    for (int i = 0; i < 10; ++i) {
        const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return Words4{{c0, c1, c2, c3}};
}

// The words of block `c` (elements 4c .. 4c + 3) under a seed: counter (c low word,
// c high word, 0, 0), key (seed low word, seed high word).
__device__ __forceinline__ Words4 philox_block(u64 c, u32 seed_lo, u32 seed_hi) {
    return philox4x32_10((u32)c, (u32)(c >> 32), 0u, 0u, seed_lo, seed_hi);
}

}  // namespace cq
