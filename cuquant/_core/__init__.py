"""What every op shares, whichever backend runs it: the dtypes table, arrays in and out
(families, devices, streams), argument checks, the helpers of a public op's path, and the
replay cache of repeated calls. Imports nothing of the layers above it, nor CuPy."""
