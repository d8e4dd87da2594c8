// Group-wise integer quantization in DeepSpeed's format (docs/formats.md section 5), its inverse, and
// the batched inverse (many tensors, one launch).
//
//   quantize_groups<DeepSpeed<BITS>, T, ...>    codes and params [groups, 1 or 2]; the
//                                               symmetry is the run-time `mode` (1 = sym)
//   dequantize_groups<DeepSpeedCodes<BITS, SYM>, Tout, VEC, UNROLL, WARP_PARAMS>
//   dequantize_groups_spanning<DeepSpeedCodes<BITS, SYM>, Tout, VEC, NP, UNROLL>
//   dequantize_batched<Tout>                    a table of tensors, each its own bits,
//                                               symmetry, group size and path
#include "groups.cuh"

namespace cq {

// Symmetric:  m = max|x|; mult = 1 if m == 0 else 2**BITS / (2 m); offset = 0 (exactly:
//             x - (+0) is x for every x, -0 included), params [1 / mult].
// Asymmetric: mult = 1 if hi == lo else 2**BITS / (hi - lo); offset = (hi + lo) * 0.5;
//             params [1 / mult, offset].
// Code: clamp(rne((x - offset) * mult), -2**(BITS-1), 2**(BITS-1) - 1), NaN giving 0;
// 4-bit codes are packed with the first element of a pair in the high nibble.
template <int B>
struct DeepSpeed {
    static constexpr int BITS = B;
    static constexpr bool LOW_FIRST = false, DEQUANT = false, ALT_RANDOM = false;
    // The tile kernel's next tile in flight (quantize_groups_tiles).
    static constexpr bool PREFETCH = true;
    static constexpr int TILE_BLOCKS = 2;
    struct Params {
        float mult, offset, inv;
        bool careful;   // mult is 0, inf or NaN, or offset is not finite: NaN can arise
    };

    template <typename T>
    __device__ static __forceinline__ Params prepare(float lo, float hi, const QuantArgs& a) {
        constexpr float RANGE = (float)(1 << BITS);
        Params p;
        if (a.mode) {
            const float m = fmax_nan(fabs_bits(lo), fabs_bits(hi));
            p.mult = f2u(m) == 0u ? 1.0f : div_rn(RANGE, mul_rn(m, 2.0f));
            p.offset = 0.0f;
        } else {
            p.mult = feq(hi, lo) ? 1.0f : div_rn(RANGE, sub_rn(hi, lo));
            p.offset = mul_rn(add_rn(hi, lo), 0.5f);
        }
        p.inv = div_rn(1.0f, p.mult);
        const u32 mb = f2u(p.mult);
        p.careful = !(mb != 0u && mb < 0x7f800000u && finite(p.offset));
        return p;
    }

    template <typename T>
    __device__ static __forceinline__ void store_params(const Params& p, i64 g, void* p0, void*,
                                                        const QuantArgs& a) {
        float* out = static_cast<float*>(p0);
        if (a.mode) {
            out[g] = p.inv;
        } else {
            Vec<float, 2> v;
            v.v[0] = p.inv;
            v.v[1] = p.offset;
            store_vec<float, 2>(out + 2 * g, v);
        }
    }

    template <int VEC, bool ALIGNED = true>
    __device__ static __forceinline__ void random(u32 (&r)[VEC], i64, const QuantArgs&, const u32*) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) r[k] = 0u;
    }

    // The symmetric variant, compiled apart: no offset to subtract, and one clamp, since
    // |x| <= m bounds x * mult by 2**(BITS-1) (1 + 2**-23): only 2**(BITS-1) itself rounds
    // out of range, while below the codes reach -2**(BITS-1) exactly.
    __device__ static __forceinline__ bool alternate(const QuantArgs& a) { return a.mode != 0; }

    // body(m), m being a with its mode a constant, so that body's tests of it fold away.
    template <class Body>
    __device__ static __forceinline__ void with_mode(const QuantArgs& a, Body body) {
        QuantArgs m = a;
        if (a.mode) {
            m.mode = 1;
            body(m);
        } else {
            m.mode = 0;
            body(m);
        }
    }

    // The asymmetric variant of 16-bit x needs no lower clamp either. There hi + lo is
    // exact in float32, or else the two differ in exponent by more than 12, so that
    // hi - lo is within 2**-12 of |hi + lo|: the offset is then (hi + lo) / 2 within
    // 2**-24 (hi - lo) (or within 2**-150, a bfloat16 subnormal half, where hi - lo >=
    // 2**-133), and (x - offset) * mult >= -2**(BITS-1) (1 + 2**-15), which rounds to
    // -2**(BITS-1). Float32 x can have hi + lo round by as much as hi - lo (hi = lo + one
    // ulp), which puts lo's quotient at -2**BITS: it keeps both clamps.
    //
    // The code in the low BITS bits of the result.
    template <bool CAREFUL, bool SYM, typename T>
    __device__ static __forceinline__ u32 encode(float x, const Params& p, u32, float&) {
        constexpr float LO = -(float)(1 << (BITS - 1)), HI = (float)((1 << (BITS - 1)) - 1);
        float v, c;
        if constexpr (SYM && !CAREFUL) {
            v = mul_rn(x, p.mult);
            c = fmin_num(v, HI);
        } else if constexpr (!CAREFUL && sizeof(T) == 2) {
            v = mul_rn(sub_rn(x, p.offset), p.mult);
            c = fmin_num(v, HI);
        } else {
            v = SYM ? mul_rn(x, p.mult) : mul_rn(sub_rn(x, p.offset), p.mult);
            c = fclamp(v, LO, HI);
        }
        const u32 r = f2u(add_rn(c, RNE_MAGIC));
        if (CAREFUL && is_nan(v)) return 0u;
        return r;
    }
};

// Dequantization: sym dtype(f32(q) * p0); asym dtype(f32(f32(q) * p0) + p1).
template <int BITS_, bool SYM>
struct DeepSpeedCodes {
    static constexpr int BITS = BITS_;
    // 4-bit codes: the warp-shared dequantizer prefetches into L2 the warp a wave on. Half a
    // byte read for every two written leaves too few loads in flight to cover the memory's
    // latency, and the prefetch adds them without registers; 8-bit codes already have
    // enough, and the prefetch's instructions only cost them.
    static constexpr bool L2_PREFETCH = BITS_ == 4;
    static constexpr bool SIGNED = true, LOW_FIRST = false;
    struct Params { float inv, offset; };
    __device__ static __forceinline__ Params load(i64 g, const void* p0, const void*) {
        const float* p = static_cast<const float*>(p0);
        Params r;
        if constexpr (SYM) {
            r.inv = p[g];
            r.offset = 0.0f;
        } else {
            const Vec<float, 2> v = load_vec<float, 2>(p + 2 * g);
            r.inv = v.v[0];
            r.offset = v.v[1];
        }
        return r;
    }
    // A warp's parameters: p0 is [groups] or [groups, 2] float32.
    __device__ static __forceinline__ const void* param_addr(i64 g, bool second, const void* p0, const void*) {
        const float* p = static_cast<const float*>(p0);
        return SYM ? p + g : p + 2 * g + second;
    }
    __device__ static __forceinline__ float lane_param(i64 g, bool second, const void* p0, const void* p1) {
        return *static_cast<const float*>(param_addr(g, second, p0, p1));
    }
    __device__ static __forceinline__ Params from_lanes(float w, int j) {
        Params r;
        r.inv = __shfl_sync(0xffffffffu, w, j);
        r.offset = SYM ? 0.0f : __shfl_sync(0xffffffffu, w, 16 + j);
        return r;
    }
    __device__ static __forceinline__ float value(float c, const Params& p) {
        const float y = mul_rn(c, p.inv);
        return SYM ? y : add_rn(y, p.offset);
    }
};

}  // namespace cq

#include "groups/batched.cuh"
