// Symmetric scaled quantization (INT8 and FP8 e4m3, docs/formats.md sections 3 and 4) and its inverse.
//
// Kernels, each a template over the input type Tin, the code (CodeInt8 / CodeE4M3), and the
// vector width VEC (16 bytes of input per access, or 1 where rows are not 16-byte aligned):
//   quantize_row_groups  groups of G contiguous elements of each row (per channel, per row,
//                        per block, per token group, SmoothQuant)
//   smooth_quant_rows    SmoothQuant rows with smooth and 1 / smooth in shared memory
//   quantize_tensor      one scale for the whole tensor, one launch: amax, grid handshake,
//                        then quantize, keeping the first CACHE vectors per thread on chip
//   quantize_static      a given scale
//   quantize_tiles       128x128 tiles (DeepSeek-V3 weight blocks)
//   dequantize_scaled    codes times the scale of their tensor / row / group / tile
//
// Each kernel family is in its own header under symmetric/; the code types (the formats)
// are in common/codes.cuh.
#include "symmetric/quantize_vec.cuh"
#include "symmetric/row_groups.cuh"
#include "symmetric/smooth_rows.cuh"
#include "symmetric/tensor.cuh"
#include "symmetric/static.cuh"
#include "symmetric/tiles.cuh"
#include "symmetric/dequantize.cuh"
