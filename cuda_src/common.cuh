// Primitives shared by every cuquant kernel: storage types, vector memory access,
// non-flushing float arithmetic, exact division, rounding, code encoders and decoders,
// and reductions. One copy of each.
//
// The file needs no CUDA header, so NVRTC compiles it without an include path.
//
// CuPy compiles every module with -ftz=true, which would flush subnormal inputs, scales
// and quotients to zero. Every float operation on a quantization path is therefore
// written as explicit PTX without .ftz, and maxima are taken on the float bits.
//
// The parts, each in common/: base (types, traits, bit casts), arith (float arithmetic,
// division), convert, vector (memory access), codes, scale (scale rules), reduce, random (Philox).
#pragma once
#include "common/base.cuh"
#include "common/arith.cuh"
#include "common/convert.cuh"
#include "common/vector.cuh"
#include "common/codes.cuh"
#include "common/scale.cuh"
#include "common/reduce.cuh"
#include "common/random.cuh"
