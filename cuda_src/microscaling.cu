// Microscaling formats (docs/formats.md section 9): MXFP8 (e4m3 codes, E8M0 scales, blocks
// of 32), MXFP4 (e2m1 codes two a byte, E8M0 scales, blocks of 32) and NVFP4 (e2m1 codes,
// e4m3 scales, blocks of 16, a float32 global amax), and their inverses.
//
//   quantize_mx<Tin, FMT, VEC, ALIGNED, ROUND, GRID_AMAX>   one launch a call; GRID_AMAX
//                                      reduces NVFP4's tensor amax first (grid handshake)
//   dequantize_mx<FMT, Tout, ALIGNED>
//
// The rules (scale bytes, e2m1 rounding, the swizzled layout) are in microscaling/formats.cuh.
#include "microscaling/formats.cuh"
#include "microscaling/quantize.cuh"
#include "microscaling/dequantize.cuh"
