"""Dialects: the `docker run -e ...` lines of the GPU-sharing products vmgpu replaces, read as a
vmgpu share spec (the grammar of vmgpu/spec.py), so that an operator's existing lines keep working.

DIALECTS below is the one translation table: each row names a product, the variables it reads
and the function that turns them into per-GPU sizes.  `translate` reads every row, with the
native `VMGPU=` and NVIDIA's `NVIDIA_VISIBLE_DEVICES`, and gives one share or one error:

- `VMGPU=` stays the native form; it wins nothing silently: a dialect set beside it must give
  the same share, or the container is refused (so are two dialects that disagree).
- `NVIDIA_VISIBLE_DEVICES` alone gives whole GPUs (mem=100%), as nvidia-container-toolkit does;
  beside a form that sizes memory it selects the GPUs (a form that names its own GPUs must name
  the same ones; `all`, the default of NVIDIA's CUDA images, selects nothing against those).
- Alibaba eGPU's ALIYUN_COM_GPU_OOM_SCRIPT becomes the guest's oom-script= only where it is a
  bare name (a script of the host's OOM-script directory, checked by vmgpud at admission); a
  path (a program the container names) is never run.
- What vmgpu cannot honour (priorities, an OOM script given as a path, memory "reserved" by the
  product) is returned as notes, which the runtime logs as not enforced; nothing is dropped
  silently.  Every value is checked (ASCII digits, ranges, lengths); a bad one is one line of
  SpecError naming the variable, never a trace.

Sources of each rule are cited at the reader; where a product's documents are silent the
reading chosen is the one an operator would expect, and the comment (and README) says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from vmgpu import spec as share
from vmgpu.errors import InvalidArgument, SpecError

NATIVE = "VMGPU"
NVIDIA = "NVIDIA_VISIBLE_DEVICES"
MAX_GPUS = share.MAX_GPU_INDEX + 1
_DIGITS = re.compile(r"^[0-9]{1,15}$", re.ASCII)
_KEY = re.compile(r"^[A-Za-z_]{1,16}$", re.ASCII)


def _q(name: str, value: str) -> str:
    """NAME='value' as a one-line message quotes it: long values cut, control characters escaped."""
    cut = value if len(value) <= 40 else value[:40] + "..."
    return f"{name}={cut!r}"


def _int(name: str, value: str, lo: int, hi: int, what: str = "") -> int:
    v = value.strip()
    if not _DIGITS.match(v):
        raise SpecError(f"{_q(name, value)} is not a whole number{what}")
    n = int(v)
    if not lo <= n <= hi:
        raise SpecError(f"{_q(name, value)} is outside {lo}..{hi}{what}")
    return n


def _list(name: str, value: str) -> list[str]:
    items = [i.strip() for i in value.split(",", MAX_GPUS)]
    if len(items) > MAX_GPUS:
        raise SpecError(f"{_q(name, value)} lists more than {MAX_GPUS} values")
    if any(not i for i in items):
        raise SpecError(f"{_q(name, value)} has an empty entry (values are separated by single commas)")
    return items


def _gpus(name: str, value: str) -> tuple[str, ...]:
    """A comma-separated list of GPU indices or UUIDs (as nvidia-smi prints them), each once."""
    out = []
    for item in _list(name, value):
        if item.upper().startswith("MIG-"):
            raise SpecError(f"{_q(name, value)}: MIG devices are not shared by vmgpu; name whole GPUs")
        try:
            gpu = share._gpu(item, name)
        except SpecError:
            raise SpecError(f"{_q(name, value)}: {item[:40]!r} is neither a GPU index nor a UUID (GPU-...)") from None
        if gpu in out:
            raise SpecError(f"{_q(name, value)} names GPU {gpu} twice")
        out.append(gpu)
    return tuple(out)


@dataclass(frozen=True)
class Reading:
    """What one dialect asks for, per GPU.  gpus None: the dialect does not name them (chosen by
    NVIDIA_VISIBLE_DEVICES, else GPU 0..count-1).  mem and compute (the weight) hold one value per
    GPU, or one value for every GPU; cap and priority are the same on every GPU."""

    dialect: str
    variables: tuple[str, ...]
    mem: tuple[str, ...]
    compute: tuple[int, ...] = (100,)
    gpus: tuple[str, ...] | None = None
    count: int | None = None  # how many GPUs the dialect asks for, when it says
    count_from: str = ""  # the variable that says it
    settings: share.Settings = share.Settings()  # the guest's forwarder settings it gives
    cap: int = 0  # % of its throughput alone on each GPU at most, 0: none
    priority: str = "normal"


@dataclass(frozen=True)
class Dialect:
    """A row of the translation table."""

    name: str
    product: str
    variables: tuple[str, ...]
    read: Callable[[dict[str, str], list[str]], Reading | None]  # (env, notes) -> None: not in use


# ---- China Telecom eGPU ----------------------------------------------------------------------
# EGPU="POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:PGPU=1,MEM=...,WEIGHT=..."
# The form is the seeds' (issue 17; DESIGN.md "Share specs"): groups separated by ":", fields by
# ",".  China Telecom's documents are not public; the reading here is ours, and the README says
# so: the first group may be a header (POLICY, ONLINE, TYPE); every other group is one GPU:
# PGPU its index (or UUID), MEM MiB, WEIGHT its compute share in percent (1..100, vmgpu's
# weight=; absent: 100, as VMGPU's default).  ONLINE=1 (an online, latency-bound service) is
# priority=high, ONLINE=0 (offline work) the default normal: an offline container is not put below
# guests that did not say.  POLICY, which vmgpu cannot apply per container (a GPU's policy is the
# host's, `vmgpu policy`), is a note.
EGPU_HEADER = ("POLICY", "ONLINE", "TYPE")
EGPU_DEVICE = ("PGPU", "MEM", "WEIGHT")


def _egpu_fields(group: str, i: int, value: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in group.split(",", 8):
        k, sep, v = item.partition("=")
        k = k.strip().upper()
        if not sep or not _KEY.match(k):
            raise SpecError(f"{_q('EGPU', value)}: group {i}: {item.strip()[:40]!r} is not KEY=VALUE")
        if k not in EGPU_HEADER + EGPU_DEVICE:
            raise SpecError(f"EGPU group {i}: unknown field {k} (header: POLICY, ONLINE, TYPE; GPU: PGPU, MEM, WEIGHT)")
        if k in fields:
            raise SpecError(f"EGPU group {i}: {k} is given twice")
        fields[k] = v.strip()
    return fields


def _ct_egpu(env: dict[str, str], notes: list[str]) -> Reading | None:
    value = env.get("EGPU")
    if value is None:
        return None
    gpus, mems, weights = [], [], []
    online = 0
    groups = value.split(":", MAX_GPUS + 1)
    if len(groups) > MAX_GPUS + 1:
        raise SpecError(f"{_q('EGPU', value)} has more than {MAX_GPUS} GPU groups")
    for i, group in enumerate(groups, 1):
        fields = _egpu_fields(group, i, value)
        if "PGPU" not in fields:
            if i != 1 or set(fields) & set(EGPU_DEVICE):
                raise SpecError(f"EGPU group {i}: PGPU is missing (each group after the header is one GPU)")
            if fields.get("TYPE", "DOCKER").upper() != "DOCKER":
                raise SpecError(f"EGPU TYPE={fields['TYPE'][:40]!r}: this runtime serves containers (TYPE=DOCKER)")
            if "POLICY" in fields:
                _int("EGPU POLICY", fields["POLICY"], 0, 99)
                notes.append(
                    f"EGPU POLICY={fields['POLICY']} is not enforced per container: a GPU's compute policy is "
                    "the host's (`vmgpu policy GPU POLICY`)"
                )
            if "ONLINE" in fields:
                online = _int("EGPU ONLINE", fields["ONLINE"], 0, 1)
            continue
        if set(fields) & set(EGPU_HEADER):
            raise SpecError(f"EGPU group {i}: POLICY, ONLINE and TYPE belong in the first group, not a GPU's")
        if "MEM" not in fields:
            raise SpecError(f"EGPU group {i}: MEM is missing (the GPU's memory in MiB)")
        gpus.append(_gpus("EGPU PGPU", fields["PGPU"])[0])
        mems.append(f"{_int('EGPU MEM', fields['MEM'], 1, share.MAX_MEM_MIB, ' (MiB)')}M")
        weights.append(_int("EGPU WEIGHT", fields["WEIGHT"], 1, 100, " (percent)") if "WEIGHT" in fields else 100)
    if not gpus:
        raise SpecError(f"{_q('EGPU', value)} names no GPU (give PGPU=N,MEM=MiB,WEIGHT=percent groups)")
    return Reading(
        "ct-egpu", ("EGPU",), tuple(mems), tuple(weights), tuple(gpus), priority="high" if online else "normal"
    )


# ---- Alibaba cGPU ----------------------------------------------------------------------------
# cGPU's README (installation package) and ACK's shared-GPU docs: ALIYUN_COM_GPU_MEM_CONTAINER is
# the memory the container sees, ALIYUN_COM_GPU_MEM_DEV the card's total, both in GiB ("-e
# ALIYUN_COM_GPU_MEM_DEV=4 -e ALIYUN_COM_GPU_MEM_CONTAINER=1" gives 1G of a 4G card); without
# MEM_CONTAINER cGPU does not start; ALIYUN_COM_GPU_VISIBLE_DEVICES lists indices or UUIDs;
# CGPU_DISABLE=true|1 turns cGPU off.  ALIYUN_COM_GPU_MEM_UNIT (GiB, or MiB from the gpushare
# device plugin) says the unit where set.  A list of sizes ("3,4,5,6", the seeds' line) is
# ours to read, the docs show one value: one size per GPU, in the order of the GPUs (one value:
# every GPU).  ALIYUN_COM_GPU_SCHD_WEIGHT is relative to the host's max_inst (1..25) in cGPU's
# docs, which no container line carries; we read one unit as 5% (max_inst 20), as a public GPU
# scheduler writing cGPU's and eGPU's variables together does (weight = GPU_UTIL_PER_DEVICE / 5).
# ALIYUN_COM_GPU_HIGH_PRIO=1 is priority=high (0: normal).
CGPU_VARS = (
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_MEM_DEV",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES",
    "ALIYUN_COM_GPU_SCHD_WEIGHT",
    "ALIYUN_COM_GPU_MEM_UNIT",
    "ALIYUN_COM_GPU_HIGH_PRIO",
    "CGPU_DISABLE",
)
_UNITS = {"GIB": "G", "GB": "G", "G": "G", "MIB": "M", "MB": "M", "M": "M"}
CGPU_WEIGHT_PCT = 5


def _aliyun_cgpu(env: dict[str, str], notes: list[str]) -> Reading | None:
    present = tuple(k for k in CGPU_VARS if k in env)
    mem = env.get("ALIYUN_COM_GPU_MEM_CONTAINER")
    if mem is None:
        if present:
            notes.append(f"{', '.join(present)} ignored: without ALIYUN_COM_GPU_MEM_CONTAINER cGPU does not start")
        return None
    if env.get("CGPU_DISABLE", "").strip().lower() in ("1", "true"):
        notes.append(f"{', '.join(present)} ignored: CGPU_DISABLE={env['CGPU_DISABLE'].strip()} turns cGPU off")
        return None
    unit_text = env.get("ALIYUN_COM_GPU_MEM_UNIT", "GiB")
    unit = _UNITS.get(unit_text.strip().upper())
    if unit is None:
        raise SpecError(f"{_q('ALIYUN_COM_GPU_MEM_UNIT', unit_text)} is neither GiB nor MiB")
    most = share.MAX_MEM_MIB >> 10 if unit == "G" else share.MAX_MEM_MIB
    sizes = [_int("ALIYUN_COM_GPU_MEM_CONTAINER", v, 1, most) for v in _list("ALIYUN_COM_GPU_MEM_CONTAINER", mem)]
    if "ALIYUN_COM_GPU_MEM_DEV" in env:
        dev = _int("ALIYUN_COM_GPU_MEM_DEV", env["ALIYUN_COM_GPU_MEM_DEV"], 1, most)
        if max(sizes) > dev:
            raise SpecError(
                f"{_q('ALIYUN_COM_GPU_MEM_CONTAINER', mem)} asks more than "
                f"ALIYUN_COM_GPU_MEM_DEV={dev}, the card's memory"
            )
    compute = 100
    if "ALIYUN_COM_GPU_SCHD_WEIGHT" in env:
        w = _int("ALIYUN_COM_GPU_SCHD_WEIGHT", env["ALIYUN_COM_GPU_SCHD_WEIGHT"], 1, 100 // CGPU_WEIGHT_PCT)
        compute = w * CGPU_WEIGHT_PCT
    high = "ALIYUN_COM_GPU_HIGH_PRIO" in env and _int("ALIYUN_COM_GPU_HIGH_PRIO", env["ALIYUN_COM_GPU_HIGH_PRIO"], 0, 1)
    visible = env.get("ALIYUN_COM_GPU_VISIBLE_DEVICES")
    gpus = _gpus("ALIYUN_COM_GPU_VISIBLE_DEVICES", visible) if visible is not None else None
    count = len(sizes) if len(sizes) > 1 else None
    mems = tuple(f"{s}{unit}" for s in sizes)
    return Reading(
        "aliyun-cgpu",
        present,
        mems,
        (compute,),
        gpus,
        count,
        "ALIYUN_COM_GPU_MEM_CONTAINER",
        priority="high" if high else "normal",
    )


# ---- Alibaba eGPU (PAI) ----------------------------------------------------------------------
# PAI's "eGPU interface usage example": AMP_VGPU_ENABLE=1 is the master switch (without it eGPU
# changes nothing); GPU_MEM_PER_DEVICE is the memory per GPU in bytes; GPU_UTIL_PER_DEVICE the
# limit of compute in percent (vmgpu's cap=); the GPUs are NVIDIA_VISIBLE_DEVICES's (UUIDs, indices, or both);
# ALIYUN_COM_GPU_MEM_RESERVED (MiB, default 10) is what eGPU itself keeps of the memory;
# AMP_USE_HOST_DAEMON=1 is carried unchanged.  Bytes become whole MiB, rounded down (a container
# never gets more than it asked).  GPU_MEM_PER_DEVICE absent: the whole card (our reading; the
# docs show it set).  ALIYUN_COM_GPU_OOM_SCRIPT names a program to run on OOM: a container may
# not make the host run a program of its choosing, so a path is never run; a bare name is read as
# vmgpu's oom-script= (a script the host's operator put in its OOM-script directory).
EGPU_VARS = (
    "AMP_VGPU_ENABLE",
    "GPU_MEM_PER_DEVICE",
    "GPU_UTIL_PER_DEVICE",
    "ALIYUN_COM_GPU_MEM_RESERVED",
    "ALIYUN_COM_GPU_OOM_SCRIPT",
    "AMP_USE_HOST_DAEMON",
)


def _aliyun_egpu(env: dict[str, str], notes: list[str]) -> Reading | None:
    present = tuple(k for k in EGPU_VARS if k in env)
    if env.get("AMP_VGPU_ENABLE", "").strip() != "1":
        rest = [k for k in present if k != "AMP_VGPU_ENABLE"]
        if rest:
            notes.append(f"{', '.join(rest)} ignored: eGPU is off without AMP_VGPU_ENABLE=1")
        return None
    mem = "100%"
    if "GPU_MEM_PER_DEVICE" in env:
        most = share.MAX_MEM_MIB << 20
        b = _int("GPU_MEM_PER_DEVICE", env["GPU_MEM_PER_DEVICE"], 1 << 20, most, " (bytes, at least 1 MiB)")
        mem = f"{b >> 20}M"
    cap = 0  # a limit per device, as eGPU enforces it: vmgpu's cap=, beside weighted guests
    if "GPU_UTIL_PER_DEVICE" in env:
        cap = _int("GPU_UTIL_PER_DEVICE", env["GPU_UTIL_PER_DEVICE"], 1, 100, " (percent)")
    if "ALIYUN_COM_GPU_MEM_RESERVED" in env:
        r = _int("ALIYUN_COM_GPU_MEM_RESERVED", env["ALIYUN_COM_GPU_MEM_RESERVED"], 0, share.MAX_MEM_MIB, " (MiB)")
        notes.append(
            f"ALIYUN_COM_GPU_MEM_RESERVED={r} is not enforced: vmgpu keeps its own context reserve out of "
            "the share (the host's setting), not the container's"
        )
    settings = share.Settings()
    if "ALIYUN_COM_GPU_OOM_SCRIPT" in env:
        try:
            settings = share.Settings(share.oom_script_name(env["ALIYUN_COM_GPU_OOM_SCRIPT"]))
        except SpecError:
            given = _q("ALIYUN_COM_GPU_OOM_SCRIPT", env["ALIYUN_COM_GPU_OOM_SCRIPT"])
            notes.append(
                f"ALIYUN_COM_GPU_OOM_SCRIPT is not run: {given} is no script name, and a container may not "
                "name a program for the host to run; give the name of "
                "a script in the host's OOM-script directory (oom-script=NAME)"
            )
    if "AMP_USE_HOST_DAEMON" in env:
        notes.append("AMP_USE_HOST_DAEMON has no meaning under vmgpu (accepted, not used)")
    return Reading("aliyun-egpu", present, (mem,), settings=settings, cap=cap)


# ---- boyue -----------------------------------------------------------------------------------
# boyue_VGPU (how many vGPUs), boyue_GMEM (memory per vGPU, MiB), boyue_RATIO (compute share):
# the seeds' names (issue 17); boyue's documents are not public, the reading is ours: N vGPUs are
# N GPUs (vmgpu gives a guest a GPU once), chosen by NVIDIA_VISIBLE_DEVICES or else GPUs
# 0..N-1; RATIO in percent (1..100, absent: 100) is the weight; GMEM absent: the whole card.
BOYUE_VARS = ("boyue_VGPU", "boyue_GMEM", "boyue_RATIO")


def _boyue(env: dict[str, str], notes: list[str]) -> Reading | None:
    present = tuple(k for k in BOYUE_VARS if k in env)
    if not present:
        return None
    n = _int("boyue_VGPU", env["boyue_VGPU"], 1, MAX_GPUS, " (vGPUs)") if "boyue_VGPU" in env else 1
    mem = f"{_int('boyue_GMEM', env['boyue_GMEM'], 1, share.MAX_MEM_MIB, ' (MiB)')}M" if "boyue_GMEM" in env else "100%"
    ratio = _int("boyue_RATIO", env["boyue_RATIO"], 1, 100, " (percent)") if "boyue_RATIO" in env else 100
    return Reading("boyue", present, (mem,), (ratio,), None, n, "boyue_VGPU")


# The translation table: every product whose `docker run` lines vmgpu reads, besides VMGPU= and
# NVIDIA_VISIBLE_DEVICES (read by translate itself).
DIALECTS = (
    Dialect("ct-egpu", "China Telecom eGPU", ("EGPU",), _ct_egpu),
    Dialect("aliyun-cgpu", "Alibaba Cloud cGPU", CGPU_VARS, _aliyun_cgpu),
    Dialect("aliyun-egpu", "Alibaba Cloud eGPU (PAI)", EGPU_VARS, _aliyun_egpu),
    Dialect("boyue", "boyue GPU pooling", BOYUE_VARS, _boyue),
)
VARIABLES = frozenset({NATIVE, NVIDIA, *(v for d in DIALECTS for v in d.variables)})


# ---- NVIDIA ----------------------------------------------------------------------------------
# nvidia-container-toolkit's docs ("Specialized Configurations with Docker", GPU enumeration):
# NVIDIA_VISIBLE_DEVICES is a comma-separated list of GPU UUIDs or indices; `all` (the default
# of NVIDIA's CUDA images); `none` (no GPU, driver capabilities only); `void`, empty or unset
# (runc's behaviour).  Docker's --gpus sets it too.
def _nvidia(env: dict[str, str]) -> str | tuple[str, ...] | None:
    value = env.get(NVIDIA)
    if value is None:
        return None
    v = value.strip()
    if v.lower() in ("", "void", "none", "all"):
        return v.lower() or "void"
    return _gpus(NVIDIA, v)


@dataclass(frozen=True)
class Translation:
    """The share a container's environment asks for (spec None: no GPU), which forms gave it,
    and what of it vmgpu does not enforce (notes, for the log)."""

    dialect: str  # "vmgpu", "nvidia", a table row's name, or several joined by "+"
    variables: tuple[tuple[str, str], ...]  # (name, value) of every variable read
    spec: share.ShareSpec | None
    notes: tuple[str, ...] = field(default=())

    @property
    def text(self) -> str | None:
        return self.spec.to_text() if self.spec is not None else None

    def shown(self) -> str:
        """The variables as one log field: NAME='value' ..."""
        return " ".join(_q(k, v) for k, v in self.variables)


def environment(config: dict) -> dict[str, str]:
    """The variables of the table (and VMGPU, NVIDIA_VISIBLE_DEVICES) in an OCI config's
    process.env; a variable set twice with two values is refused (which one counts is unclear)."""
    process = config.get("process") if isinstance(config, dict) else None
    env = process.get("env") if isinstance(process, dict) else None
    if env is None:
        return {}
    if not isinstance(env, list):
        raise InvalidArgument("the container's process.env is not a list of NAME=value strings")
    out: dict[str, str] = {}
    for kv in env:
        if not isinstance(kv, str):
            raise InvalidArgument(f"the container's environment has an entry that is not text: {str(kv)[:40]!r}")
        name, _, value = kv.partition("=")
        if name not in VARIABLES:
            continue
        if name in out and out[name] != value:
            raise SpecError(f"{name} is set twice, to {out[name][:40]!r} and {value[:40]!r}: set it once")
        out[name] = value
    return out


def _slices(r: Reading, nvidia, host_gpus: Callable[[], list[str]] | None) -> share.ShareSpec:
    """The share of one reading, its GPUs chosen (its own, else NVIDIA_VISIBLE_DEVICES's, else 0..n-1)."""
    label = ", ".join(r.variables)
    if r.gpus is not None:
        gpus = r.gpus
    elif isinstance(nvidia, tuple):
        gpus = nvidia
        if r.count is not None and len(gpus) != r.count:
            raise SpecError(f"{r.count_from} asks for {r.count} GPUs but {NVIDIA} names {len(gpus)}: make them agree")
    elif nvidia in ("none", "void"):
        raise SpecError(f"{label} ask for GPU memory but {NVIDIA}={nvidia} gives no GPU: drop one")
    elif nvidia == "all" and r.count is None:
        if host_gpus is None:
            raise SpecError(f"{label} with {NVIDIA}=all: the host's GPUs cannot be listed here; name them")
        gpus = tuple(host_gpus())
        if not gpus:
            raise SpecError(f"{label} with {NVIDIA}=all: the host has no GPU")
    else:  # unset, or `all` beside a count: the first GPUs
        gpus = tuple(str(i) for i in range(r.count or 1))
    per_gpu = []
    for what, values in (("memory sizes", r.mem), ("compute shares", r.compute)):
        if len(values) not in (1, len(gpus)):
            raise SpecError(f"{label}: {len(values)} {what} for {len(gpus)} GPUs: give one, or one per GPU")
        per_gpu.append(values if len(values) == len(gpus) else values * len(gpus))
    extra = (f",cap={r.cap}%" if r.cap else "") + (f",priority={r.priority}" if r.priority != "normal" else "")
    text = ";".join(f"gpu={g},mem={m},weight={c}{extra}" for g, m, c in zip(gpus, *per_gpu, strict=True))
    try:
        return dataclasses.replace(share.parse(text), settings=r.settings)
    except SpecError as e:
        raise SpecError(f"{label}: {e.message}") from None


def _same(a: share.ShareSpec, b: share.ShareSpec) -> bool:
    return sorted(s.to_text() for s in a.slices) == sorted(s.to_text() for s in b.slices)


def _settings(forms) -> share.Settings:
    """The guest's settings the forms give together; two that give one setting differently, or
    one that gives a setting VMGPU= does not carry (VMGPU= is the share as given), are refused."""
    merged: dict[str, tuple[str, str]] = {}  # setting -> (value, the form's variables)
    for name, variables, spec, _ in forms:
        for k, v in spec.settings.fields().items():
            if k in merged and merged[k][0] != v:
                raise SpecError(
                    f"{merged[k][1]} ask for {k}={merged[k][0]} but {', '.join(variables)} ({name}) for {k}={v}: "
                    "give one, or make them agree"
                )
            merged[k] = (v, ", ".join(variables))
    out = share._settings({k: v for k, (v, _) in merged.items()}, "settings")
    native = next((spec for name, _, spec, _ in forms if name == "vmgpu"), None)
    if native is not None and native.settings != out:
        missing = sorted(set(out.fields()) - set(native.settings.fields()))
        raise SpecError(
            f"{merged[missing[0]][1]} ask for {missing[0]}={merged[missing[0]][0]}, which VMGPU does not carry: "
            f"add it to VMGPU (;{missing[0]}=...) or drop it"
        )
    return out


def translate(env: dict[str, str], host_gpus: Callable[[], list[str]] | None = None) -> Translation:
    """The share of a container's environment (environment(config)).  host_gpus: the host's GPU
    indices, asked only where `NVIDIA_VISIBLE_DEVICES=all` must be spelled out."""
    notes: list[str] = []
    nvidia = _nvidia(env)
    forms: list[tuple[str, tuple[str, ...], share.ShareSpec, bool]] = []  # (dialect, variables, spec, names GPUs)
    if NATIVE in env:
        try:
            forms.append(("vmgpu", (NATIVE,), share.parse(env[NATIVE]), True))
        except SpecError as e:  # the parser quotes the value as given: one line here
            raise SpecError(f"VMGPU: {e.message if e.message.isprintable() else ascii(e.message)}") from None
    for d in DIALECTS:
        r = d.read(env, notes)
        if r is not None:
            forms.append((r.dialect, r.variables, _slices(r, nvidia, host_gpus), r.gpus is not None))
    if not forms:
        if nvidia is None or nvidia in ("none", "void"):
            return Translation("none", (), None, tuple(notes))
        gpus = nvidia if isinstance(nvidia, tuple) else tuple(host_gpus() if host_gpus else ())
        if not gpus:
            raise SpecError(f"{NVIDIA}=all: the host's GPUs cannot be listed here; name them ({NVIDIA}=0,1)")
        spec = share.parse(";".join(f"gpu={g},mem=100%" for g in gpus))
        return Translation("nvidia", ((NVIDIA, env[NVIDIA]),), spec, tuple(notes))
    first_name, first_vars, first, _ = forms[0]
    for name, variables, other, _ in forms[1:]:
        if not _same(first, other):
            raise SpecError(
                f"{', '.join(first_vars)} ({first_name}) ask for {first.to_text()} but {', '.join(variables)} "
                f"({name}) ask for {other.to_text()}: give one share, or make them agree"
            )
    first = dataclasses.replace(first, settings=_settings(forms))
    used = [v for _, vs, _, _ in forms for v in vs]
    if nvidia is not None:
        if nvidia in ("none", "void"):
            raise SpecError(
                f"{', '.join(first_vars)} ask for {first.to_text()} but {NVIDIA}={nvidia} gives no GPU: drop one"
            )
        if isinstance(nvidia, tuple):
            for name, variables, spec, names_gpus in forms:
                if names_gpus and sorted(s.gpu for s in spec.slices) != sorted(nvidia):
                    raise SpecError(
                        f"{', '.join(variables)} ({name}) name GPUs {','.join(s.gpu for s in spec.slices)} but "
                        f"{NVIDIA}={','.join(nvidia)}: name the same GPUs (the same way: index or UUID)"
                    )
        used.append(NVIDIA)
    dialect = "+".join(dict.fromkeys(name for name, _, _, _ in forms))
    return Translation(dialect, tuple((v, env[v]) for v in dict.fromkeys(used)), first, tuple(notes))
