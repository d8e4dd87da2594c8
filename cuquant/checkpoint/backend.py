"""Where the work runs: the NumPy backend or a GPU through CuPy."""

from __future__ import annotations

import numpy as np

from .formats import CheckpointError


# Host arrays of at least this many bytes are page-locked on the GPU backend; smaller ones
# (scales, zero points) are not worth a locked block.
_PINNED_MIN = 4 << 20
# Locked blocks are rounded up to this, so that bands of different tensors reuse them.
_PINNED_UNIT = 16 << 20


class Backend:
    """NumPy on the host, or CuPy on a CUDA device: moving bands of rows there and back,
    and the error statistics.

    On the GPU, bands cross in page-locked host memory (DMA at the bus's speed, no page
    faults), from a pool of this backend's own, kept for the run and released by
    `release_host_memory`."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp
        # xp is None for a cluster's client, whose tasks take the backend where they run.
        self._pinned = None if xp is None or xp is np else xp.cuda.PinnedMemoryPool()

    def host_buffer(self, shape, dtype) -> np.ndarray:
        """An uninitialized host array: page-locked on the GPU backend when large."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._pinned is None or nbytes < _PINNED_MIN:
            return np.empty(shape, dtype)
        mem = self._pinned.malloc(-(-nbytes // _PINNED_UNIT) * _PINNED_UNIT)
        return np.ndarray(shape, dtype, buffer=mem)

    def __reduce__(self):
        # A cluster's task takes the backend of the machine it runs on.
        return select_backend, (self.name,)

    def to_device(self, host: np.ndarray):
        if self.xp is np:
            return host
        if host.dtype.itemsize == 1 and host.dtype.kind not in "iub":
            host = host.view(np.uint8)  # float8: CuPy holds the codes as uint8
        x = self.xp.empty(host.shape, host.dtype)
        x.set(np.ascontiguousarray(host))
        return x

    def to_host(self, a) -> np.ndarray:
        if isinstance(a, np.ndarray):
            return a
        out = self.host_buffer(a.shape, a.dtype)
        a.get(out=out)
        return out

    def release_host_memory(self) -> None:
        """Give the page-locked blocks no array uses any more back to the system."""
        if self._pinned is not None:
            self._pinned.free_all_blocks()

    def error_terms(self, w, deq) -> tuple[float, float, float]:
        """(sum w^2, sum (deq - w)^2, max |deq - w|) over a band, in float32 math."""
        xp = self.xp
        w32 = w.astype(xp.float32).reshape(-1)
        e = deq.astype(xp.float32).reshape(-1) - w32
        if e.size == 0:
            return 0.0, 0.0, 0.0
        return float(xp.dot(w32, w32)), float(xp.dot(e, e)), float(xp.abs(e).max())


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean no GPU
        return False


# One backend of each kind a process: a cluster's tasks each unpickle the backend they were
# given (`Backend.__reduce__`), and sharing it lets them reuse one pool of page-locked
# memory instead of locking and unlocking pages for every band.
_IN_THIS_PROCESS: dict[str, Backend] = {}


def select_backend(device: str = "auto") -> Backend:
    """``"cuda"`` (CuPy kernels), ``"cpu"`` (the NumPy backend) or ``"auto"``: the GPU
    when there is one. The same backend object for the same choice within a process."""
    if device not in ("auto", "cpu", "cuda"):
        raise CheckpointError(f"device must be auto, cpu or cuda; got {device!r}")
    if device == "cpu" or (device == "auto" and not gpu_available()):
        name = "cpu"
    elif not gpu_available():
        raise CheckpointError("--device cuda: no CUDA device is usable here (CuPy missing, no "
                              "driver, or no GPU); use --device cpu")
    else:
        name = "cuda"
    backend = _IN_THIS_PROCESS.get(name)
    if backend is None:
        if name == "cpu":
            backend = Backend("cpu", np)
        else:
            import cupy

            backend = Backend("cuda", cupy)
        backend = _IN_THIS_PROCESS.setdefault(name, backend)
    return backend


def release_host_memory() -> None:
    """Give back the page-locked memory no array uses any more, of every backend this
    process made (a cluster's client asks its workers for this at the end of a run)."""
    for backend in list(_IN_THIS_PROCESS.values()):
        backend.release_host_memory()
