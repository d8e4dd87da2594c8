"""A/B of this round's variants, from the repository root:
python ab_r21.py name=dir ... Every output compared bit for bit with the first variant's
(DIFF). Names starting with pf run seeded rounding's tile kernel on a persistent grid
(each warp many tiles, the next one loaded while it encodes the last); pf4* with 4 units a
lane. 16384 x 7168 (16384 x 7680 for G=512 and 2048 cases: whole groups), x copy counting
x and every output."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp, ml_dtypes
import cuquant
from cuquant import groupwise, zero_point as zp
from benchmarks import harness

dirs = {k: pathlib.Path(v).resolve() for k, v in (a.split("=", 1) for a in sys.argv[1:] if "=" in a)}
print({k: v.name for k, v in dirs.items()})
rounds = int(os.environ.get("AB_ROUNDS", "3"))
_plan = zp.quantize_plan
current = {"name": ""}

def _patched_plan(*args, **kw):
    if current["name"].startswith("pf") and kw.get("tile_fmt_of_bits") is zp._zp_seeded_format:
        kw["persistent_tiles"] = True
    return _plan(*args, **kw)

zp.quantize_plan = _patched_plan

def use(name):
    current["name"] = name
    groupwise.TILES["units_per_lane"] = 4 if name.startswith("pf4") else 8
    groupwise.SMALL["on"] = name != "head"   # head's sources have no small-group kernel
    harness.use_sources(dirs[name])

timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw/1e12:.3f} TB/s", flush=True)
rng = np.random.default_rng(0)

def special_rows(x):
    """Rows whose groups take the careful arithmetic, among ordinary ones."""
    x[3, ::7] = np.inf
    x[5, 100:900] = np.nan
    x[8, :] = 60000 + x[8, :] * 0.01 if x.dtype == np.float16 else 1e30 + x[8, :] * 1e27
    x[11, :] = 0
    return x

def zp_call(x, bits, g, seeded):
    return lambda: cuquant.quantize_groupwise_zero_point(
        x, bits=bits, group_size=g, rounding="stochastic" if seeded else "nearest",
        seed=12345 if seeded else None)

def ds_call(x, bits, sym, g):
    return lambda: cuquant.quantize_groupwise(x, bits, sym, g)

# (label, dtype, columns, special rows, call maker, which variants)
ALL, STAGED = list(dirs), [k for k in dirs if not k.startswith("pf")]
CASES = [
    ("zp seeded 4-bit G=128", np.float16, 7168, False, lambda x: zp_call(x, 4, 128, True), ALL),
    ("zp seeded 8-bit G=128", np.float16, 7168, False, lambda x: zp_call(x, 8, 128, True), ALL),
    ("zp seeded bf16 4-bit G=128", ml_dtypes.bfloat16, 7168, False, lambda x: zp_call(x, 4, 128, True), ALL),
    ("zp seeded 4-bit G=32", np.float16, 7168, False, lambda x: zp_call(x, 4, 32, True), ALL),
    ("zp seeded 4-bit G=128 special", np.float16, 7168, True, lambda x: zp_call(x, 4, 128, True), ALL),
    ("zp nearest 4-bit G=128", np.float16, 7168, False, lambda x: zp_call(x, 4, 128, False), STAGED),
    ("zp nearest 4-bit G=512 (staged)", np.float16, 7680, False, lambda x: zp_call(x, 4, 512, False), STAGED),
    ("zp nearest 8-bit G=512 special (staged)", np.float16, 7680, True, lambda x: zp_call(x, 8, 512, False), STAGED),
    ("zp seeded 8-bit G=512 special (staged)", np.float16, 7680, True, lambda x: zp_call(x, 8, 512, True), STAGED),
    ("ds 4-bit asym G=2048 (staged)", np.float16, 7168, False, lambda x: ds_call(x, 4, False, 2048), STAGED),
    ("ds 8-bit sym G=2048 (staged)", np.float16, 7168, False, lambda x: ds_call(x, 8, True, 2048), STAGED),
    ("ds 4-bit asym G=2048 special (staged)", np.float16, 7168, True, lambda x: ds_call(x, 4, False, 2048), STAGED),
    ("ds 8-bit asym G=20 (general)", np.float16, 7180, False, lambda x: ds_call(x, 8, False, 20), STAGED),
    ("ds 4-bit asym G=20 special (general)", np.float16, 7180, True, lambda x: ds_call(x, 4, False, 20), STAGED),
    ("ds 8-bit sym G=6 (general)", np.float16, 7176, False, lambda x: ds_call(x, 8, True, 6), STAGED),
    ("ds 4-bit asym G=63 (general)", np.float16, 7182, False, lambda x: ds_call(x, 4, False, 63), STAGED),
    ("ds 8-bit asym G=20 float32 (general)", np.float32, 7180, False, lambda x: ds_call(x, 8, False, 20), STAGED),
    ("ds 8-bit asym G=3 bf16 (general)", ml_dtypes.bfloat16, 7170, False, lambda x: ds_call(x, 8, False, 3), STAGED),
    ("ds 4-bit sym G=32 unaligned (general)", np.float16, 7168, False, lambda x: ds_call(x, 4, True, 32), STAGED),
    ("zp nearest 4-bit G=20 (general)", np.float16, 7180, False, lambda x: zp_call(x, 4, 20, False), STAGED),
    ("zp seeded 8-bit G=20 special (general)", np.float16, 7180, True, lambda x: zp_call(x, 8, 20, True), STAGED),
]
only = os.environ.get("AB_ONLY")
for label, dt, cols, special, make, names in CASES:
    if only and only not in label:
        continue
    h = rng.standard_normal((16384, cols), dtype=np.float32).astype(dt)
    if special:
        h = special_rows(h)
    x = cp.asarray(h)
    if "unaligned" in label:   # 2 bytes past a 16-byte boundary
        buf = cp.empty(x.size + 8, dtype=x.dtype)
        x = buf[1:1 + x.size].reshape(x.shape)
        x[...] = cp.asarray(h)
    use(names[0])
    call = make(x)
    moved = x.nbytes + sum(o.nbytes for o in call())
    times, notes = harness.time_variants(names, use, call, timer, rounds, reps=15)
    cells = {k: " ".join(f"{ms*1e3:.1f} ({moved / (ms * 1e-3) / copy_bw:.3f})" for ms in v) for k, v in times.items()}
    print(f"{label}:", " | ".join(f"{k}: {c}" for k, c in cells.items()), " ".join(notes), flush=True)
    del x
    cp.get_default_memory_pool().free_all_blocks()
