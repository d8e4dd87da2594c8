"""A check of the kernels' machine code for one compiler hazard: a subroutine that some
lanes of a warp call while the others take the other side of a branch, and that writes a
uniform register the other side still reads.

Uniform registers (UR0, UR1, ...) are one per warp, not one per lane. When the lanes of a
warp part at a branch and one side calls an out-of-line subroutine (`CALL.REL.NOINC`, e.g.
the group-wise quantizers' `emit_unit_careful`), what the subroutine writes to a uniform
register is what the other side's lanes read there too. A kernel compiled so that the other
side keeps a value in a register the subroutine overwrites computes wrong results for the
lanes that did not call: a variant of the zero-point quantizer did (docs/design.md,
"Checks of the compiled kernels"). This finds such places: at each branch whose
predicate is per lane and one of whose sides reaches a call, the uniform registers live on
the other side (by a backward liveness pass over the function's control flow) that the
subroutine writes.

    python -m benchmarks.sass_audit [--arch sm_90] [--sources zero_point.cu,groupwise.cu]
                                    [--nvrtc path/to/libnvrtc.so.12]

Needs NVRTC (the cuda12 / cuda13 extra, or any libnvrtc given by --nvrtc, so that every
compiler version the extras admit can be checked) and `cuobjdump` (on PATH, or the
nvidia-cuda-cuobjdump wheel); no GPU. Machine code that this cuobjdump cannot list (NVRTC
12.2's, under CUDA 13's tools) is listed by the `nvdisasm` beside it. Exits 1 when it
finds a hazard.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_CALL = re.compile(r"CALL\.REL\.NOINC (0x[0-9a-f]+)")
_TARGET = re.compile(r"(0x[0-9a-f]+)")
_UR = re.compile(r"UR(\d+)")
_PER_LANE_REGISTER = re.compile(r"-?\|?R\d+\|?(\.\w+)*")


def parse_listing(text: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass output: {function name: [(address, instruction)]}."""
    functions: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in text.splitlines():
        if "Function :" in line:
            current = functions.setdefault(line.split("Function :")[1].strip(), [])
        elif current is not None:
            m = _INSTRUCTION.search(line)
            if m:
                current.append((int(m.group(1), 16), m.group(2).strip()))
    return functions


class _Instruction:
    __slots__ = ("address", "text", "guard", "opcode", "operands", "defs", "uses")

    def __init__(self, address: int, text: str):
        self.address, self.text = address, text
        m = re.match(r"(@!?U?P\w+\s+)?(\S+)\s*(.*)", text)
        self.guard = (m.group(1) or "").strip()
        self.opcode = m.group(2)
        self.operands = [o.strip() for o in m.group(3).split(",")] if m.group(3) else []
        wide = ".64" in self.opcode or "WIDE" in self.opcode
        self.defs: set[int] = set()
        rest = self.operands
        stores = self.opcode.startswith(("ST", "BRA", "SYNCS", "UST", "RED", "ATOM"))
        if rest and re.fullmatch(r"UR\d+", rest[0]) and not stores:
            n = int(rest[0][2:])
            self.defs = {n, n + 1} if wide else {n}
            rest = rest[1:]
        self.uses: set[int] = set()
        for k, operand in enumerate(rest):
            for m2 in _UR.finditer(operand):
                n = int(m2.group(1))
                self.uses.add(n)
                # pairs: a memory descriptor, and the 64-bit addend of a wide multiply-add
                if "desc[" in operand or ("WIDE" in self.opcode and k == len(rest) - 1):
                    self.uses.add(n + 1)


def hazards(instructions: list[tuple[int, str]]) -> list[tuple[int, tuple[int, ...]]]:
    """The (branch address, uniform registers) where a per-lane branch has a side that
    calls a subroutine writing uniform registers that are live on its other side."""
    ins = [_Instruction(a, t) for a, t in instructions]
    index = {x.address: i for i, x in enumerate(ins)}
    calls = {int(m.group(1), 16) for x in ins for m in [_CALL.search(x.text)] if m}
    if not calls:
        return []
    written = {}
    for target in calls:
        regs, i = set(), index.get(target, len(ins))
        while i < len(ins):
            regs |= ins[i].defs
            if ins[i].opcode.startswith("RET"):
                break
            i += 1
        written[target] = regs

    def successors(i: int) -> list[int]:
        x = ins[i]
        nxt = [i + 1] if i + 1 < len(ins) else []
        if x.opcode.startswith("BRA"):
            m = _TARGET.search(x.text)
            taken = [index[int(m.group(1), 16)]] if m and int(m.group(1), 16) in index else []
            conditional = x.guard or ".DIV" in x.opcode or ".U" in x.opcode
            return taken + (nxt if conditional else [])
        if x.opcode.startswith(("EXIT", "RET")):
            return nxt if x.guard else []
        return nxt

    succ = [successors(i) for i in range(len(ins))]
    live: list[set[int]] = [set() for _ in ins]
    changed = True
    while changed:
        changed = False
        for i in range(len(ins) - 1, -1, -1):
            out = set().union(*(live[j] for j in succ[i])) if succ[i] else set()
            kill = ins[i].defs if not ins[i].guard else set()
            new = ins[i].uses | (out - kill)
            if new != live[i]:
                live[i], changed = new, True

    def reaches_call(i: int, limit: int = 1000):
        """The subroutine a straight run of code from instruction i calls, if any."""
        for _ in range(limit):
            if i >= len(ins):
                return None
            m = _CALL.search(ins[i].text)
            if m:
                return int(m.group(1), 16)
            x = ins[i]
            if x.opcode.startswith("BRA") and not x.guard:
                t = _TARGET.search(x.text)
                if not t or int(t.group(1), 16) not in index:
                    return None
                i = index[int(t.group(1), 16)]
                continue
            if x.opcode.startswith(("BRA", "EXIT", "RET", "BSYNC")):
                return None
            i += 1
        return None

    preds: list[list[int]] = [[] for _ in ins]
    for i, nexts in enumerate(succ):
        for j in nexts:
            preds[j].append(i)

    def per_lane(i: int) -> bool:
        """Whether branch i's predicate may differ between lanes: a definition of it that
        reaches the branch (back through the control flow) reads a per-lane register or
        predicate (uniform ones, URn and UPn, never do) and is not a vote, whose answer
        every lane that votes gets; or no definition is found."""
        guard = ins[i].guard
        if "UP" in guard:
            return False
        p = re.search(r"P\d", guard).group(0)
        stack, seen = list(preds[i]), set()
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            x = ins[k]
            if x.operands and x.operands[0] == p:
                if not x.opcode.startswith("VOTE"):
                    sources = x.operands[2:] if "SETP" in x.opcode else x.operands[1:]
                    if any(_PER_LANE_REGISTER.fullmatch(o) or re.fullmatch(r"!?P\d", o)
                           for o in sources):
                        return True
                if not x.guard:
                    continue  # this path's definition; a guarded one may keep the older
            elif p in x.operands[1:2]:
                return True  # a carry out
            if not preds[k] or len(seen) > 4000:
                return True  # the entry, or too far: not known, assume per lane
            stack.extend(preds[k])
        return not seen

    found = set()
    for i, x in enumerate(ins):
        if not (x.opcode.startswith("BRA") and x.guard and len(succ[i]) == 2) or not per_lane(i):
            continue
        for side, other in ((succ[i][0], succ[i][1]), (succ[i][1], succ[i][0])):
            target = reaches_call(side)
            if target is not None and live[other] & written[target]:
                found.add((x.address, tuple(sorted(live[other] & written[target]))))
    return sorted(found)


_LABEL = re.compile(r"^\s*([.$][\w.$]+):\s*$")
_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
_LABEL_USE = re.compile(r"`\(([.$][\w.$]+)\)")


def from_nvdisasm(text: str) -> str:
    """`nvdisasm -raw` output in cuobjdump's form, for parse_listing: a `Function :` line
    for each `.text.` section, and branch and call targets as addresses, not labels."""
    lines = text.splitlines()
    address, pending = {}, []
    for line in lines:
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        at = _ADDRESS.search(line)
        if at and pending:
            for name in pending:
                address.setdefault(name, int(at.group(1), 16))
            pending = []
    out = []
    for line in lines:
        section = re.match(r"^\.text\.(\S+):$", line)
        if section:
            out.append("Function : " + section.group(1))
            continue
        out.append(_LABEL_USE.sub(
            lambda m: hex(address[m.group(1)]) if m.group(1) in address else m.group(0), line))
    return "\n".join(out)


def _cuobjdump() -> str:
    path = shutil.which("cuobjdump")
    if path:
        return path
    for root in sys.path:
        for hit in glob.glob(os.path.join(root, "nvidia", "**", "bin", "cuobjdump"), recursive=True):
            return hit
    raise SystemExit("cuobjdump not found: install nvidia-cuda-cuobjdump or a CUDA toolkit")


def _whole_elf(image: bytes) -> bytes:
    """CuPy's getCUBIN drops the image's last byte (it returns it as if it were a
    NUL-terminated string). The ELF header says where the image ends; the missing byte is
    the last of the section header table, zero in every image read here."""
    import struct

    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return image + b"\0" if len(image) == end - 1 else image


def cubins(arch: str, sources: list[str] | None = None, library: str | None = None):
    """(source, cubin) for every program `compile.programs` compiles; with `library`, a
    libnvrtc of any version, in programs of 40 name expressions on two threads."""
    from cuquant._cuda import compile as _compile
    from cuquant._cuda import kernels as _kernels

    table = {src: exprs for src, exprs in _compile.all_specializations().items()
             if not sources or src in sources}
    if library is None:
        from cupy_backends.cuda.libs import nvrtc

        for src, _, prog in _compile.programs(arch, table):
            yield src, _whole_elf(nvrtc.getCUBIN(prog))
        return
    from concurrent.futures import ThreadPoolExecutor

    # NVRTC opens its builtins library by name: load the one beside it first.
    for builtins in glob.glob(os.path.join(os.path.dirname(library), "libnvrtc-builtins.so.*")):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(library)
    options = [o.encode() for o in _compile.nvrtc_options(arch)]

    def compile_part(job):
        src, part = job
        prog, size = ctypes.c_void_p(), ctypes.c_size_t()
        lib.nvrtcCreateProgram(ctypes.byref(prog), _kernels.source(src).encode(), src.encode(),
                               0, None, None)
        try:
            for e in part:
                lib.nvrtcAddNameExpression(prog, e.encode())
            argv = (ctypes.c_char_p * len(options))(*options)
            if lib.nvrtcCompileProgram(prog, len(options), argv):
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise RuntimeError(f"NVRTC failed on {src} for {arch}:\n{log.value.decode()}")
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            image = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, image)
            return src, image.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    jobs = [(src, exprs[i:i + 40])
            for src, exprs in table.items() for i in range(0, len(exprs), 40)]
    with ThreadPoolExecutor(2) as pool:
        yield from pool.map(compile_part, jobs)


def nvrtc_version(library: str | None) -> str:
    if library is None:
        from cupy_backends.cuda.libs import nvrtc

        return "%d.%d" % nvrtc.getVersion()
    major, minor = ctypes.c_int(), ctypes.c_int()
    ctypes.CDLL(library).nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def listing_of(tool: str, path: str) -> str:
    """The machine code of the cubin at `path`, in cuobjdump's form."""
    out = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if out.returncode == 0 and "Function :" in out.stdout:
        return out.stdout
    nvdisasm = os.path.join(os.path.dirname(tool), "nvdisasm")
    return from_nvdisasm(subprocess.run([nvdisasm, "-raw", path], capture_output=True,
                                        text=True, check=True).stdout)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sass_audit")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--sources", default="", help="comma-separated .cu files (default: all)")
    p.add_argument("--nvrtc", default=None, help="a libnvrtc to compile with (default: CuPy's)")
    opts = p.parse_args()
    tool = _cuobjdump()
    checked = flagged = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        for src, cubin in cubins(opts.arch, [s for s in opts.sources.split(",") if s], opts.nvrtc):
            with open(path, "wb") as f:
                f.write(cubin)
            for name, ins in parse_listing(listing_of(tool, path)).items():
                checked += 1
                found = hazards(ins)
                if found:
                    flagged += 1
                    print(f"{src} {name}: " + ", ".join(
                        f"branch {a:#x} UR{','.join(map(str, r))}" for a, r in found))
    print(f"{checked} functions ({opts.arch}, NVRTC {nvrtc_version(opts.nvrtc)}), "
          f"{flagged} with a hazard")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
