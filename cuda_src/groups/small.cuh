// quantize_groups_small: small groups off the fast path, a thread a group.
#pragma once
#include "groups/quantize.cuh"

namespace cq {

// The quantizer for small groups off the fast path (a group not a whole number of 16-byte
// units, or x not 16-byte aligned): a block takes SMALL_THREADS consecutive groups at a
// time, one a thread. The 16-byte words that hold their elements are loaded into shared
// memory, coalesced; each thread reduces, prepares and encodes its group from there, its
// codes a byte each into shared memory (and its reconstruction over its input); then the
// block writes the codes out, packed, as whole words of q but at its ends, and the
// reconstructions. The general kernel (quantize_groups with one byte of codes a unit)
// reads each group with a team of threads, an element a thread, with narrow loads and
// lanes idle while a group's statistics are reduced.
//
// Shared memory (the host's small_smem_bytes): the words of a chunk's elements, one more
// for the chunk's start within its first word, then a byte a code, moved by up to 6 bytes.
constexpr int SMALL_THREADS = 256;

// With random words, the elements from a multiple of four on go four at a time, so that
// seeded rounding makes one block of four words for four elements, not one for each.
// Without random words, one loop: the three measured slower for the other formats.
template <class F, typename T, bool CAREFUL, bool ALT>
__device__ __forceinline__ void encode_small_group(T* gx, u8* gc, const typename F::Params& p, i64 e,
                                                   int G, const QuantArgs& a, const u32* rbits) {
    auto one = [&](int j, u32 rnd) {
        float d;
        gc[j] = (u8)F::template encode<CAREFUL, ALT, T>(to_f32(gx[j]), p, rnd, d);
        if constexpr (F::DEQUANT) gx[j] = from_f32<T>(d);
    };
    auto alone = [&](int j) {   // an element with a word of its own
        u32 rnd[1];
        F::template random<1>(rnd, e + j, a, rbits);
        one(j, rnd[0]);
    };
    if constexpr (!(ALT && F::ALT_RANDOM)) {
#pragma unroll 4
        for (int j = 0; j < G; ++j) one(j, 0u);
    } else {
        const int to4 = (int)((4 - (e & 3)) & 3), lead = to4 < G ? to4 : G;
        const int body = lead + ((G - lead) & ~3);
        int j = 0;
        for (; j < lead; ++j) alone(j);
        for (; j < body; j += 4) {
            u32 rnd[4];
            F::template random<4, false>(rnd, e + j, a, rbits);   // rbits may be unaligned here
#pragma unroll
            for (int k = 0; k < 4; ++k) one(j + k, rnd[k]);
        }
        for (; j < G; ++j) alone(j);
    }
}

template <class F, typename T>
__global__ void __launch_bounds__(SMALL_THREADS)
quantize_groups_small(const T* __restrict__ x, u8* __restrict__ q, void* __restrict__ p0,
                      void* __restrict__ p1, T* __restrict__ deq, const u32* __restrict__ rbits,
                      i64 groups, i64 group_size, int mode, u32 seed_lo, u32 seed_hi) {
    typedef MinMax<T> Acc;
    typedef typename F::Params Params;
    constexpr int NG = SMALL_THREADS;
    extern __shared__ Vec<u32, 4> small_words[];
    const int G = (int)group_size, t = threadIdx.x;
    const QuantArgs a{groups, group_size, group_size, mode, seed_lo, seed_hi};
    // The codes are placed so that those of q's first whole word start a word of shared
    // memory: a word of q is then one word of 8-bit codes, or two of 4-bit ones.
    constexpr int CPB = F::BITS == 8 ? 1 : 2;   // codes a byte of q
    u8* const code_area = reinterpret_cast<u8*>(small_words + (NG * G * (int)sizeof(T) + 31) / 16);
    for (i64 c = blockIdx.x; c * NG < groups; c += gridDim.x) {
        const i64 g0 = c * NG, e0 = g0 * G;
        const int ng = (int)(groups - g0 < NG ? groups - g0 : NG), ne = ng * G;
        u8* const qo = q + e0 / CPB;   // e0 is even (NG is): a chunk holds whole bytes of q
        const int nb = ne / CPB, head = (int)((4 - (reinterpret_cast<u64>(qo) & 3)) & 3);
        u8* const codes = code_area + CPB * ((4 - head) & 3);
        const u64 start = reinterpret_cast<u64>(x + e0), first = start & ~(u64)15;
        const int words = (int)((start + (u64)ne * sizeof(T) - first + 15) >> 4);
        const Vec<u32, 4>* src = reinterpret_cast<const Vec<u32, 4>*>(first);
#pragma unroll 4
        for (int i = t; i < words; i += NG) small_words[i] = src[i];
        T* xs = reinterpret_cast<T*>(reinterpret_cast<u8*>(small_words) + (start - first));
        __syncthreads();
        bool mine = false;
        Params p;
        if (t < ng) {
            Acc acc;
#pragma unroll 4
            for (int j = 0; j < G; ++j) acc.add(xs[t * G + j]);
            u32 w[Acc::WORDS];
            acc.pack(w);
            float lo, hi;
            Acc::unpack(w, lo, hi);
            p = F::template prepare<T>(lo, hi, a);
            F::template store_params<T>(p, g0 + t, p0, p1, a);
            mine = p.careful;
        }
        // A choice for the whole warp (warp_careful), the mode's loops built apart.
        const bool careful = warp_careful(mine);
        if (t < ng) {
            F::with_mode(a, [&](const QuantArgs& m) {
                T* gx = xs + t * G;
                u8* gc = codes + t * G;
                const i64 e = e0 + (i64)t * G;
                if (careful) {
                    if (F::alternate(m)) encode_small_group<F, T, true, true>(gx, gc, p, e, G, m, rbits);
                    else encode_small_group<F, T, true, false>(gx, gc, p, e, G, m, rbits);
                } else {
                    if (F::alternate(m)) encode_small_group<F, T, false, true>(gx, gc, p, e, G, m, rbits);
                    else encode_small_group<F, T, false, false>(gx, gc, p, e, G, m, rbits);
                }
            });
        }
        __syncthreads();
        // The bytes of q before its first whole word, the words, the bytes after.
        auto byte_of = [&](int i) -> u32 {
            if constexpr (F::BITS == 8) {
                return codes[i];
            } else {
                const u32 c0 = codes[2 * i] & 0xfu, c1 = codes[2 * i + 1] & 0xfu;
                return F::LOW_FIRST ? c0 | (c1 << 4) : (c0 << 4) | c1;
            }
        };
        const int lead = head < nb ? head : nb, q_words = (nb - lead) >> 2;
        if (t < lead) qo[t] = (u8)byte_of(t);
        u32* const qw = reinterpret_cast<u32*>(qo + lead);
        for (int w = t; w < q_words; w += NG) {
            if constexpr (F::BITS == 8) {
                qw[w] = *reinterpret_cast<const u32*>(codes + lead + 4 * w);
            } else {
                const Vec<u32, 2> c8 = *reinterpret_cast<const Vec<u32, 2>*>(codes + 2 * (lead + 4 * w));
                // Bytes (c0 c1 c2 c3) (c4 c5 c6 c7), codes in their low nibbles: the firsts
                // of the pairs c0 c2 c4 c6 and the seconds c1 c3 c5 c7, a byte each.
                const u32 first = prmt(c8.v[0], c8.v[1], 0x6420u) & 0x0f0f0f0fu;
                const u32 second = prmt(c8.v[0], c8.v[1], 0x7531u) & 0x0f0f0f0fu;
                qw[w] = F::LOW_FIRST ? first | (second << 4) : (first << 4) | second;
            }
        }
        for (int i = lead + 4 * q_words + t; i < nb; i += NG) qo[i] = (u8)byte_of(i);
        if constexpr (F::DEQUANT) {
            for (int i = t; i < ne; i += NG) deq[e0 + i] = xs[i];
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------

}  // namespace cq
