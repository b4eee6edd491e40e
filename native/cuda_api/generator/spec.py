"""The API spec: api.toml, checked against cuda.h's prototypes and the probed driver's exports."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tomllib

CUDA_API_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # native/cuda_api
VARIANTS = ("_ptds", "_ptsz")
OP_FIRST = 16  # below: the protocol's own opcodes ([protocol] in api.toml)
HOST_SOURCES = os.path.normpath(os.path.join(CUDA_API_DIR, "..", "..", "host_forwarder", "native"))


class SpecError(Exception):
    pass


@dataclasses.dataclass
class Param:
    ctype: str  # e.g. "const char *"
    name: str

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def pointee(self) -> str:
        t = self.ctype[:-1].strip()
        return re.sub(r"^const\s+", "", t)

    @property
    def base(self) -> str:
        return re.sub(r"^const\s+", "", self.ctype).strip()


@dataclasses.dataclass
class Func:
    name: str
    params: list[Param]
    spec: dict
    variants: list[str] = dataclasses.field(default_factory=list)

    @property
    def cls(self) -> str:
        return self.spec["class"]


def read_prototypes(include_dir: str) -> dict[str, list[Param]]:
    """Prototypes of cuda.h, including the versioned and per-thread names."""
    header = os.path.join(include_dir, "cuda.h")
    if not os.path.exists(header):
        raise SpecError(f"{header} not found: install the CUDA toolkit or pass --cuda-include")
    protos: dict[str, list[Param]] = {}
    for defines in (["-D__CUDA_API_VERSION_INTERNAL"], []):
        text = subprocess.run(
            ["cc", "-E", *defines, "-I", include_dir, header],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        own, keep = [], False
        for line in text.splitlines():
            if line.startswith("# "):
                keep = line.split('"')[1].endswith("/cuda.h") if '"' in line else keep
                continue
            if keep:
                own.append(line)
        body = " ".join(own)
        for name, args in re.findall(r"CUresult\s+(\w+)\s*\(([^;{]*?)\)\s*;", body):
            if name in protos:
                continue
            protos[name] = parse_params(name, args)
    return protos


def parse_params(fname: str, args: str) -> list[Param]:
    args = " ".join(args.split())
    if args in ("", "void"):
        return []
    out = []
    for raw in args.split(","):
        raw = raw.strip()
        if "(" in raw or "[" in raw:
            raise SpecError(f"{fname}: cannot parse parameter {raw!r}")
        m = re.match(r"^(.*?)(\w+)$", raw)
        if not m:
            raise SpecError(f"{fname}: cannot parse parameter {raw!r}")
        ctype = " ".join(m.group(1).replace("*", " * ").split()).replace("* *", "**")
        out.append(Param(ctype=ctype.strip(), name=m.group(2)))
    return out


@dataclasses.dataclass
class ProtoOp:
    ident: str  # VG_OP_<ident>
    op: int
    name: str  # as logs and statistics show it
    doc: str


def load_protocol(spec: dict) -> list[ProtoOp]:
    """The protocol's own operations, 1..OP_FIRST-1: not CUDA calls."""
    out: list[ProtoOp] = []
    seen: dict[int, str] = {}
    for ident, e in spec.get("protocol", {}).items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", ident):
            raise SpecError(f"protocol {ident}: the name must be upper case (VG_OP_{ident})")
        op = e.get("op")
        if not isinstance(op, int) or not 1 <= op < OP_FIRST:
            raise SpecError(f"protocol {ident}: needs an op number in 1..{OP_FIRST - 1}")
        if op in seen:
            raise SpecError(f"protocol {ident}: op {op} already used by {seen[op]}")
        if not isinstance(e.get("name"), str) or not e["name"]:
            raise SpecError(f"protocol {ident}: needs a name")
        seen[op] = ident
        out.append(ProtoOp(ident, op, e["name"], e.get("doc", "")))
    return sorted(out, key=lambda p: p.op)


def backend_calls(protos: dict[str, list[Param]], host_dir: str = HOST_SOURCES) -> list[str]:
    """The driver functions the forwarder's hand-written halves call through the backend
    (`->cuName`, in host_forwarder/native): found in the sources, so never a list kept by hand."""
    found: set[str] = set()
    for name in sorted(os.listdir(host_dir)):
        if name.endswith((".c", ".h")):
            with open(os.path.join(host_dir, name)) as f:
                found |= set(re.findall(r"->\s*(cu[A-Z]\w*)\b", f.read()))
    return sorted(n for n in found if n in protos)


def check_sizes(sizes: dict, include_dir: str) -> None:
    """[sizes.<enum type>]: each value of the enum a sized parameter may take, and its bytes."""
    text = open(os.path.join(include_dir, "cuda.h")).read()
    for ctype, table in sizes.items():
        if not table or not all(isinstance(v, int) and 0 < v <= 64 for v in table.values()):
            raise SpecError(f"[sizes.{ctype}]: each value needs a size of 1..64 bytes")
        for name in table:
            if not re.search(rf"\b{name}\s*[=,}}]", text):
                raise SpecError(f"[sizes.{ctype}]: {name} is not in cuda.h")


def read_exports() -> list[str]:
    """The probed driver's exported symbols (driver/libcuda_exports.txt)."""
    with open(os.path.join(CUDA_API_DIR, "driver", "libcuda_exports.txt")) as f:
        return [ln.strip() for ln in f if ln.strip()]


def variants(name: str, exports: list[str]) -> list[str]:
    """The per-thread-stream variants of a served function, served by its entry: those the driver exports."""
    return [name + v for v in VARIANTS if name + v in exports]


def load(include_dir: str, spec_path: str):
    with open(spec_path, "rb") as f:
        spec = tomllib.load(f)
    exports = read_exports()
    protos = read_prototypes(include_dir)
    handles: dict[str, str] = spec.get("handles", {})
    check_sizes(spec.get("sizes", {}), include_dir)
    funcs: list[Func] = []
    ops: dict[int, str] = {}
    for name, fs in spec["fn"].items():
        if name not in exports:
            raise SpecError(f"{name}: not exported by the probed driver")
        if name not in protos:
            raise SpecError(f"{name}: no prototype in cuda.h")
        cls = fs.get("class")
        if cls not in ("local", "sync", "async", "custom"):
            raise SpecError(f"{name}: class must be local, sync, async or custom, not {cls!r}")
        if cls != "local":
            op = fs.get("op")
            if not isinstance(op, int) or op < OP_FIRST or op > 0xFFFF:
                raise SpecError(f"{name}: needs an op number in {OP_FIRST}..65535")
            if op in ops:
                raise SpecError(f"{name}: op {op} already used by {ops[op]}")
            ops[op] = name
        fn = Func(name, protos[name], fs)
        fn.variants = variants(name, exports)
        for v in fn.variants:
            if [p.ctype for p in protos.get(v, [])] != [p.ctype for p in fn.params]:
                raise SpecError(f"{v}: prototype differs from {name}")
        if cls in ("sync", "async"):
            check_params(fn, handles, spec.get("sizes", {}))
        funcs.append(fn)
    served = {f.name for f in funcs} | {v for f in funcs for v in f.variants}
    if "backend" in spec:
        raise SpecError("[backend] is derived from the spec and the forwarder's sources; remove it")
    extra = backend_calls(protos)
    return spec, funcs, exports, served, protos, handles, extra, load_protocol(spec)


def check_params(fn: Func, handles: dict[str, str], sizes: dict[str, dict[str, int]]) -> None:
    names = {p.name for p in fn.params}
    described = set()
    for key in ("out", "in", "inout", "in_string"):
        for n in fn.spec.get(key, []):
            if n not in names:
                raise SpecError(f"{fn.name}: {key} names unknown parameter {n!r}")
            described.add(n)
    for key in ("in_array", "out_array"):
        for n, count in fn.spec.get(key, {}).items():
            if n not in names or array_count(fn, key, n, count)[0] not in names:
                raise SpecError(f"{fn.name}: {key} {n}={count} names an unknown parameter")
            described.add(n)
    for n, bound in fn.spec.get("bounds", {}).items():
        p = next((p for p in fn.params if p.name == n), None)
        if p is None or p.is_pointer or p.ctype in handles:
            raise SpecError(f"{fn.name}: bounds names {n!r}, which is not a value parameter")
        if not (isinstance(bound, list) and len(bound) == 2 and all(isinstance(v, int) and v >= 0 for v in bound)):
            raise SpecError(f"{fn.name}: bounds {n} must be [lowest, highest], two numbers >= 0")
        if bound[0] > bound[1]:
            raise SpecError(f"{fn.name}: bounds {n}: {bound[0]} is above {bound[1]}")
    for n in fn.spec.get("address", []):
        p = next((p for p in fn.params if p.name == n), None)
        if p is None or p.pointee != "void":
            raise SpecError(f"{fn.name}: address names {n!r}, which is not a void * parameter")
        if fn.spec.get("host") != "custom":
            # the range it names depends on the call: only a hand-written host half can check it
            raise SpecError(f'{fn.name}: address {n} needs host = "custom", whose guarded half checks its range')
        described.add(n)
    for key in ("in_sized", "out_sized"):
        for n, sel in fn.spec.get(key, {}).items():
            p = next((p for p in fn.params if p.name == n), None)
            q = next((q for q in fn.params if q.name == sel), None)
            if p is None or q is None:
                raise SpecError(f"{fn.name}: {key} {n}={sel} names an unknown parameter")
            if p.pointee != "void":
                raise SpecError(f"{fn.name}: {key} {n} must be a void pointer, not {p.ctype}")
            if q.ctype not in sizes:
                raise SpecError(f"{fn.name}: {key} {n}: no [sizes.{q.ctype}] table says how big it is")
            described.add(n)
    counted = fn.spec.get("counted_out", {})
    for n, cnt in counted.items():
        p = next((p for p in fn.params if p.name == n), None)
        q = next((q for q in fn.params if q.name == cnt), None)
        if p is None or q is None or q.ctype != "size_t *" or not p.is_pointer:
            raise SpecError(f"{fn.name}: counted_out {n}={cnt} must name an array and its size_t * count")
        if len(counted) > 1 or fn.variants or fn.spec.get("host") == "custom":
            raise SpecError(f"{fn.name}: counted_out: one array, no per-thread variant, a generated host half")
        described |= {n, cnt}
    # the channel's scratch holds one array a call sets aside: an out_array or a counted_out (an
    # in_array of handles is translated in place, in the request's copy: host.py, handle_array_in)
    scratch = [*fn.spec.get("out_array", {}), *counted]
    if len(scratch) > 1:
        raise SpecError(f"{fn.name}: {', '.join(scratch)} would share the channel's scratch; one at most")
    if fn.spec.get("guest") not in (None, "cached", "front"):
        raise SpecError(f"{fn.name}: guest must be \"cached\" or \"front\", not {fn.spec.get('guest')!r}")
    for n in fn.spec.get("nullable", []):
        p = next((p for p in fn.params if p.name == n), None)
        if n not in fn.spec.get("in_array", {}) or p is None or p.pointee in handles:
            raise SpecError(f"{fn.name}: nullable must name an in_array of values, not {n!r}")
    for n in fn.spec.get("launch_config", []):
        p = next((p for p in fn.params if p.name == n), None)
        if p is None or p.ctype != "const CUlaunchConfig *":
            raise SpecError(f"{fn.name}: launch_config must name a const CUlaunchConfig * parameter, not {n!r}")
        described.add(n)
    for n in fn.spec.get("required", []):
        if n not in fn.spec.get("out", []):
            raise SpecError(f"{fn.name}: required must name an out parameter, not {n!r}")
    for n in fn.spec.get("nonnull", []):
        p = next((p for p in fn.params if p.name == n), None)
        if p is None or p.ctype not in handles:
            raise SpecError(f"{fn.name}: nonnull must name a handle parameter, not {n!r}")
    device = fn.spec.get("device", {})
    for n, size in device.items():
        p = next((p for p in fn.params if p.name == n), None)
        if p is None or p.ctype != "CUdeviceptr":
            raise SpecError(f"{fn.name}: device names {n!r}, which is not a CUdeviceptr parameter")
        device_size(fn, size)
    for p in fn.params:
        # every device address reaches the driver checked (DESIGN.md: the trust boundary, rule 2)
        if p.ctype == "CUdeviceptr" and p.name not in device and fn.spec.get("host") != "custom":
            raise SpecError(f"{fn.name}: device address {p.name} is not described (device = {{ {p.name} = ... }})")
    for p in fn.params:
        if p.is_pointer and p.name not in described:
            raise SpecError(f"{fn.name}: pointer parameter {p.name} ({p.ctype}) is not described")
        if not p.is_pointer and p.name in described:
            raise SpecError(f"{fn.name}: {p.name} is not a pointer")
    if fn.cls == "async" and any(fn.spec.get(k) for k in ("out", "out_array", "inout", "out_sized")):
        raise SpecError(f"{fn.name}: an async call cannot return values")
    par = fn.spec.get("parent")
    if par is not None:
        p = next((p for p in fn.params if p.name == par), None)
        if p is None or p.ctype not in handles:
            raise SpecError(f"{fn.name}: parent must name a handle parameter")
    d = fn.spec.get("destroys")
    if d is not None:
        p = next((p for p in fn.params if p.name == d), None)
        if p is None or p.ctype not in handles:
            raise SpecError(f"{fn.name}: destroys must name a handle parameter")


def array_count(fn: Func, key: str, n: str, count: str) -> tuple[str, int]:
    """An array's element count: a parameter, less a constant ("tensorRank-1"): (parameter, k).
    One that can go below zero must have bounds that keep it at zero or more."""
    m = re.fullmatch(r"(\w+)(?:\s*-\s*(\d+))?", str(count))
    if not m:
        raise SpecError(f"{fn.name}: {key} {n}={count!r} is not 'count' or 'count-k'")
    k = int(m.group(2) or 0)
    low = fn.spec.get("bounds", {}).get(m.group(1))
    if k and not (isinstance(low, list) and low and isinstance(low[0], int) and low[0] >= k):
        raise SpecError(f"{fn.name}: {key} {n}={count}: bounds must keep {m.group(1)} at {k} or more")
    return m.group(1), k


def device_size(fn: Func, size: str) -> tuple[str, int]:
    """A device range's size, "count[*k]" or a number of bytes: (count expression, element size)."""
    m = re.fullmatch(r"(\w+)(?:\*(\d+))?", str(size))
    if not m:
        raise SpecError(f"{fn.name}: device size {size!r} is not 'count', 'count*k' or a number")
    count, k = m.group(1), int(m.group(2) or 1)
    if not count.isdigit() and count not in {p.name for p in fn.params}:
        raise SpecError(f"{fn.name}: device size {size!r} names an unknown parameter")
    return count, k
