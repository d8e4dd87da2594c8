"""The GPU backend: the CUDA source loader (`kernels`), driver launches, device properties
and workspaces (`launch`), the kernel policy (`policy`), and one module per kernel family
that turns a checked call into a launch plan and runs it (`symmetric`, `groups` with its
formats `groupwise` and `zero_point`). CuPy is imported only when a CUDA array arrives."""
