"""`inspect_checkpoint`: what a checkpoint holds, without reading its weights."""

from __future__ import annotations

import os

from .formats import CheckpointError, FLOAT_DTYPES
from .read import (
    _engine_modules,
    _module_format,
    _refuse_engine_tensors,
    _refuse_orphan,
    open_checkpoint,
    recognise,
)


_ROLE_WORDS = {"packed": "codes", "codes": "codes", "qweight": "codes", "scale": "scale",
               "scales": "scale", "zero": "zero points", "qzeros": "zero points",
               "shape": "shape", "global_scale": "global scale",
               "input_global_scale": "activations' global scale (dropped)"}


def inspect_checkpoint(path) -> dict:
    """What a checkpoint holds: per file its metadata, per tensor its dtype, shape, bytes
    and role (high precision, the codes of a format, or a format's scale).

    Returns
    -------
    dict
        ``{"files": [{"path", "metadata", "tensors": [{"name", "dtype", "shape", "bytes",
        "role"}]}], "totals": {role: {"tensors", "bytes"}}, "problems": [str]}``
    """
    with open_checkpoint(path) as ck:
        roles: dict[str, str] = {}
        problems = []
        mods = None
        try:
            mods = _engine_modules(ck)
            if mods is None:
                _refuse_engine_tensors(ck)
        except CheckpointError as e:
            problems.append(str(e))
        for m in (mods or {}).values():
            label = _module_format(ck, m)
            for role, name in m.tensors.items():
                roles[name] = f"{label} {_ROLE_WORDS.get(role, role)}"
        for name in ck.tensors:
            if mods is not None or name in roles:
                continue
            hit = recognise(ck, name)
            if hit is not None:
                fmt = hit[0]
                roles[name] = f"{fmt.name} codes"
                roles[name + fmt.suffix] = f"{fmt.name} {'params' if fmt.grouped else 'scale'}"
        for name, info in ck.tensors.items():
            if name in roles:
                continue
            if mods is not None or problems:
                roles[name] = "high precision" if info.dtype in FLOAT_DTYPES else "other"
                continue
            try:
                _refuse_orphan(ck, name, info)
                roles[name] = "high precision" if info.dtype in FLOAT_DTYPES else "other"
            except CheckpointError as e:
                roles[name] = "codes, no scale!"
                problems.append(str(e))
        files, totals = [], {}
        for f in ck.files:
            rows = []
            for name, info in f.tensors.items():
                role = roles[name]
                rows.append({"name": name, "dtype": info.dtype, "shape": list(info.shape),
                             "bytes": info.nbytes, "role": role})
                t = totals.setdefault(role, {"tensors": 0, "bytes": 0})
                t["tensors"] += 1
                t["bytes"] += info.nbytes
            files.append({"path": f.path, "bytes": os.path.getsize(f.path),
                          "metadata": f.metadata, "tensors": rows})
        return {"files": files, "totals": totals, "problems": problems,
                "quantization_config": (ck.config or {}).get("quantization_config")}
