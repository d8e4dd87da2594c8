// Staged kernels: a producer warp copies chunks of the input into a ring of shared-memory
// stages, consumer warps reduce and quantize each chunk from shared memory.
//
// A quantizer must read a whole group before it can write any code of it. Held in
// registers, the bytes in flight per multiprocessor are bounded by the register file, and
// a block loading its next groups waits on its own reduction. Here the loads are bulk
// copies (cp.async.bulk, sm_90) issued by one thread into `stages` buffers: each stage is
// in flight while the consumers work on another, at no register cost. The ring alone
// streams near the copy bandwidth; the group-wise quantizers (a multiply per element) gain
// from it, the symmetric ones (an exact division per element) do not, since their eight
// consumer warps then run out of issue slots (docs/performance.md). On chips
// without bulk copies (sm_80, sm_89) the producer warp copies with plain loads, which is
// correct but not faster; the host picks these kernels on sm_90 and up.
//
// Barriers: full[s] completes when stage s holds its chunk (one arrival plus the copied
// bytes), empty[s] when every consumer warp has finished with it.
#pragma once
#include "common.cuh"

namespace cq {

constexpr int ST_CONSUMER_WARPS = 8;
constexpr int ST_CONSUMERS = 32 * ST_CONSUMER_WARPS;
constexpr int ST_THREADS = ST_CONSUMERS + 32;
constexpr int ST_MAX_STAGES = 8;

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#else
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
    } while (!done);
}

// Barrier among the consumer threads only (the producer warp runs ahead).
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(ST_CONSUMERS) : "memory");
}

// Copies of one stage, issued by the producer warp (every lane calls, lane `lane`).
// expect(bar, bytes) announces the bytes the stage will receive (lane 0, before any copy);
// copy(dst, src, bytes, bar) moves 16-byte-aligned runs; done(bar) closes the stage.
struct StageCopy {
    u32 bar;
    int lane;
    __device__ __forceinline__ void expect(u32 bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                         : "memory");
        __syncwarp();
#endif
    }
    // One lane's run (sm_90), or the whole warp's (older chips: every lane calls with the
    // same run and copies its share).
    __device__ __forceinline__ void copy(void* dst, const void* src, u32 bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(bar) : "memory");
#else
        const Vec<u32, 4>* s = static_cast<const Vec<u32, 4>*>(src);
        Vec<u32, 4>* d = static_cast<Vec<u32, 4>*>(dst);
        for (u32 i = 0; i < bytes / 16; ++i) d[i] = s[i];
#endif
    }
    __device__ __forceinline__ void done() const {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
#endif
    }
};

// Runs the pipeline over chunks blockIdx.x, blockIdx.x + gridDim.x, ... of nchunks.
// produce(c, stage, StageCopy) fills a stage (producer warp); consume(c, stage) uses it
// (every consumer thread). The stages start `offset` bytes into dynamic shared memory.
template <class Produce, class Consume>
__device__ __forceinline__ void run_staged(i64 nchunks, int stages, u32 stage_bytes, u32 offset,
                                           Produce produce, Consume consume) {
    extern __shared__ __align__(128) u8 dyn_smem[];
    __shared__ __align__(8) u64 bars[2 * ST_MAX_STAGES];
    const u32 full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[ST_MAX_STAGES]);
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, ST_CONSUMER_WARPS);
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    }
    __syncthreads();
    u8* const stage0 = dyn_smem + offset;
    int s = 0;
    u32 phase = 0;
    if (threadIdx.x >= ST_CONSUMERS) {
        const int lane = threadIdx.x - ST_CONSUMERS;
        for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) {
            if (lane == 0) mbar_wait(empty0 + 8 * s, phase ^ 1u);
            __syncwarp();
            produce(c, stage0 + (size_t)s * stage_bytes, StageCopy{full0 + 8 * s, lane});
            if (++s == stages) { s = 0; phase ^= 1u; }
        }
    } else {
        for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) {
            mbar_wait(full0 + 8 * s, phase);
            consume(c, stage0 + (size_t)s * stage_bytes);
            __syncwarp();
            if ((threadIdx.x & 31) == 0) mbar_arrive(empty0 + 8 * s);
            if (++s == stages) { s = 0; phase ^= 1u; }
        }
    }
}

// Copies elements [begin, end) of x (16-byte aligned, (end - begin) * sizeof(T) a multiple
// of 16) into a stage.
template <typename T>
__device__ __forceinline__ void stage_run(const T* x, i64 begin, i64 end, u8* stage, const StageCopy& cp) {
    const u32 bytes = (u32)((end - begin) * (i64)sizeof(T));
    cp.expect(bytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cp.lane == 0) cp.copy(stage, x + begin, bytes);
#else
    const u32 per = ((bytes / 16 + 31) / 32) * 16;
    const u32 lo = per * (u32)cp.lane;
    if (lo < bytes) cp.copy(stage + lo, reinterpret_cast<const u8*>(x + begin) + lo, (bytes - lo < per ? bytes - lo : per));
#endif
    cp.done();
}

}  // namespace cq
