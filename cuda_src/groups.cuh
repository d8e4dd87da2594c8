// Group-wise integer quantization machinery, shared by groupwise.cu (DeepSpeed format,
// docs/formats.md section 5) and zero_point.cu (lmdeploy format, docs/formats.md section 6).
//
// A tensor is a run of `groups` groups of G consecutive elements (C order). A kernel works
// on "units" of VEC consecutive elements: on the fast path a unit is 16 bytes of the wide
// side (VEC = 8 for 16-bit data, 4 for float32; G % VEC == 0 and aligned data), so that
// every lane loads or stores 16 contiguous bytes and a warp whole sectors; on the general
// path (any G, any alignment) VEC = 1, or 2 for 4-bit codes, so that a unit is one byte
// of packed codes, with scalar accesses. The quantizer is one template over a format
// policy F:
//
//   F::BITS, F::LOW_FIRST       code width and nibble order (first element in the low
//                               nibble?)
//   F::Params                   what a group needs to encode, made by F::prepare(lo, hi, ...)
//   F::store_params             writes a group's parameters
//   F::encode<CAREFUL, ALT, T>  one element (of input type T) to its code (and its
//                               reconstruction, when the format returns one); CAREFUL
//                               handles groups whose arithmetic can meet NaN (non-finite
//                               statistics or multipliers); ALT is the format's second
//                               variant (symmetric, stochastic), chosen once a launch by
//                               F::alternate(args)
//   F::random<VEC, ALIGNED>     the random words of a unit (stochastic rounding); ALIGNED:
//                               the caller's words at the unit are 16-byte aligned
//   F::ALT_RANDOM               whether the second variant uses random words
//   F::with_mode(args, body)    body(args) with the run-time mode made a constant, one
//                               copy of body a mode (the tile kernel's loops)
//   F::PREFETCH                 the tile kernel loads a warp's next tile while it encodes
//                               the one before (for a grid of fewer warps than tiles)
//   F::TILE_BLOCKS              the tile kernel's blocks a multiprocessor (its registers)
//
// Group statistics are the NaN-propagating minimum and maximum, taken with PTX
// max.NaN / min.NaN (IEEE 754-2019 maximum / minimum: a NaN wins, -0 < +0), on two 16-bit
// elements at once for half and bfloat16. No float comparison below is left to the
// compiler, since CuPy's -ftz=true would make it flush subnormals.
//
// Each kernel family is in its own header under groups/; the formats are policies in
// groupwise.cu and zero_point.cu.
#pragma once
#include "groups/ring.cuh"
#include "groups/stats.cuh"
#include "groups/units.cuh"
#include "groups/quantize.cuh"
#include "groups/staged.cuh"
#include "groups/tiles.cuh"
#include "groups/small.cuh"
#include "groups/dequantize.cuh"
