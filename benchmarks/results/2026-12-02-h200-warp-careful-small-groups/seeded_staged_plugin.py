"""pytest -p seeded_staged_plugin: the zero point's staged kernels built with seeded
rounding's own format (ZeroPoint<B, ZP_PHILOX>), the build whose 8-bit staged kernels
computed wrong codes under NVRTC 13.0 in the twentieth round, before the careful choice was
a warp's vote."""


def pytest_configure(config):
    from cuquant import zero_point as zp

    fmt, hold, units, tile_fmt = zp.KERNELS_BY_MODE[zp.PHILOX]
    zp.KERNELS_BY_MODE[zp.PHILOX] = (zp._zp_seeded_format, hold, units, tile_fmt)
