"""Share specs: which GPUs a guest gets, how much memory, and its share of each GPU's time.

One grammar for containers (an environment variable) and VMs (a namespaced element in
the domain's <metadata>), one validator, the same errors.

Text form (e.g. ``VMGPU="gpu=0,mem=8G,weight=50,priority=high;gpu=1,mem=25%,guarantee=30%,cap=60%"``):
    spec    := slice (";" slice)*
    slice   := field ("," field)*
    field   := "gpu=" (INDEX | UUID)            required; UUID as nvidia-smi prints it (GPU-...)
             | "mem=" SIZE                      required; 8G, 8192M, 8192 (MiB), or 50% of the card
             | "weight=" N                      optional, 1..100, default 100: relative to the other
                                                guests' weights on the GPU; never refuses admission
             | "guarantee=" PERCENT             optional, 1..100, default none: reserved at admission
                                                (a GPU's guarantees never sum past 100%) and, under
                                                the weighted policy, given first while the guest is busy
             | "cap=" PERCENT                   optional, 1..100, default none: at most this share of
                                                its throughput alone, even on an idle card
                                                (vmgpu/cap_control.py; N% of the GPU's time
                                                without vmgpud); the guests beside it stay weighted
             | "priority=" ("high"|"normal"|"low")  optional, default normal: a waiting guest of a
                                                higher priority has the GPU before any lower one
             | "compute=" N                     the old name of weight (compute=50 is weight=50:
                                                nothing reserved); not with weight
PERCENT may end in "%".  Keys and priorities are case-insensitive and whitespace around tokens is
ignored.  A GPU appears at most once.

The guest's own forwarder settings, at most one group of its own among the slices (each unset
one is the host's, `vmgpu daemon --oom-script/--peer-timeout`):
    settings := setting ("," setting)*
    setting  := "oom-script=" NAME              a script in the host's OOM-script directory
                                                (by name only: never a path)
              | "peer-timeout=" SECONDS         1..3600; "s" may follow
e.g. ``VMGPU="gpu=0,mem=8G;oom-script=notify,peer-timeout=30"``.  The context reserve is the
host's alone (`vmgpu daemon --ctx-reserve`): a guest that lowered it would use GPU memory
outside its quota.

XML form, inside the domain's <metadata> (the same fields as attributes):
    <vmgpu:share xmlns:vmgpu="https://vmgpu.dev/xmlns/share/1">
      <vmgpu:slice gpu="0" mem="8G" weight="50" guarantee="20%" cap="60%" priority="high"/>
      <vmgpu:settings oom-script="notify" peer-timeout="30"/>   (optional)
    </vmgpu:share>
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from decimal import Decimal

from vmgpu.config import PEER_TIMEOUT_S, UNIT_BYTES
from vmgpu.errors import SpecError

XML_NS = "https://vmgpu.dev/xmlns/share/1"
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", re.ASCII)
# ASCII digits only: str.isdigit() and int() also take "²" or "٣", which are no sizes or GPUs
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_SIZE = re.compile(rf"^{_NUMBER}\s*([KMGT]i?B?|B)?$", re.IGNORECASE | re.ASCII)
_PERCENT = re.compile(rf"^{_NUMBER}\s*%$", re.ASCII)
_INDEX = re.compile(r"^[0-9]+$", re.ASCII)
_UNITS_MIB = {"": Decimal(1), **{u: Decimal(n) / UNIT_BYTES["M"] for u, n in UNIT_BYTES.items()}}  # no unit: MiB
MAX_MEM_MIB = 1 << 30  # 1 PiB: more than any GPU has, and what the ledger can hold
MAX_GPU_INDEX = 1023
SLICE_KEYS = ("gpu", "mem", "weight", "guarantee", "cap", "priority", "compute")
PRIORITIES = ("high", "normal", "low")
DEFAULT_WEIGHT = 100
SETTING_KEYS = ("oom-script", "peer-timeout")
# what a guest may not set, and why
HOST_ONLY = {
    "ctx-reserve": "the context reserve is the host's setting (`vmgpu daemon --ctx-reserve`): a guest that "
    "lowered it would use GPU memory outside its quota",
}
# an OOM script's name: a file directly in the host's OOM-script directory (no path, no dot first)
_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$", re.ASCII)


def _show(value: str) -> str:
    """value as an error message quotes it: a hostile one can be long."""
    return value if len(value) <= 40 else value[:40] + "..."


def _percent_text(fraction: float) -> str:
    """fraction as the percentage that parses back to the same float ("25%", "33.3%")."""
    return f"{(Decimal(repr(fraction)) * 100).normalize():f}%"


@dataclass(frozen=True)
class Slice:
    """One GPU's share: `gpu` is an index ("0") or a UUID; memory is MiB or a fraction."""

    gpu: str
    mem_mib: int | None = None  # absolute
    mem_fraction: float | None = None  # of the card, 0 < f <= 1
    weight: int = DEFAULT_WEIGHT  # relative, 1..100
    guarantee: int = 0  # percent reserved at admission, 0: none
    cap: int = 0  # percent of its throughput alone at most (vmgpu/cap_control.py), 0: none
    priority: str = "normal"  # high, normal or low

    def mem_for(self, card_mib: int) -> int:
        """Memory in MiB on a card of card_mib."""
        if self.mem_mib is not None:
            return self.mem_mib
        return int(card_mib * (self.mem_fraction or 0))

    def share_fields(self) -> dict[str, str]:
        """The compute share's fields by their key, each default one left out (weight always given)."""
        out = {"weight": str(self.weight)}
        if self.guarantee:
            out["guarantee"] = f"{self.guarantee}%"
        if self.cap:
            out["cap"] = f"{self.cap}%"
        if self.priority != "normal":
            out["priority"] = self.priority
        return out

    def to_text(self) -> str:
        mem = f"{self.mem_mib}M" if self.mem_mib is not None else _percent_text(self.mem_fraction or 0)
        return ",".join([f"gpu={self.gpu}", f"mem={mem}", *(f"{k}={v}" for k, v in self.share_fields().items())])


@dataclass(frozen=True)
class Settings:
    """A guest's own forwarder settings; what is unset (empty, 0) is the host's."""

    oom_script: str = ""  # a script's name in the host's OOM-script directory
    peer_timeout_s: int = 0

    def fields(self) -> dict[str, str]:
        """The settings given, by their key in the spec."""
        out = {}
        if self.oom_script:
            out["oom-script"] = self.oom_script
        if self.peer_timeout_s:
            out["peer-timeout"] = str(self.peer_timeout_s)
        return out

    def to_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.fields().items())


@dataclass(frozen=True)
class ShareSpec:
    slices: tuple[Slice, ...]
    settings: Settings = Settings()

    def to_text(self) -> str:
        groups = [s.to_text() for s in self.slices]
        if self.settings.fields():
            groups.append(self.settings.to_text())
        return ";".join(groups)

    def to_xml(self) -> ET.Element:
        root = ET.Element(f"{{{XML_NS}}}share")
        for s in self.slices:
            el = ET.SubElement(root, f"{{{XML_NS}}}slice")
            el.set("gpu", s.gpu)
            el.set("mem", f"{s.mem_mib}M" if s.mem_mib is not None else _percent_text(s.mem_fraction or 0))
            for k, v in s.share_fields().items():
                el.set(k, v)
        if self.settings.fields():
            ET.SubElement(root, f"{{{XML_NS}}}settings", self.settings.fields())
        return root


def _mem(value: str, where: str) -> tuple[int | None, float | None]:
    v = value.strip()
    if v.endswith("%"):
        m = _PERCENT.match(v)
        if not m:
            raise SpecError(f"{where}: mem '{_show(value)}' is not a percentage (like 50%)")
        pct = Decimal(m.group(1))
        if not 0 < pct <= 100:
            raise SpecError(f"{where}: mem {_show(value)} must be more than 0% and at most 100% of the card")
        return None, float(pct / 100)
    m = _SIZE.match(v)
    if not m:
        raise SpecError(f"{where}: mem '{_show(value)}' is not a size (like 8G, 8192M, 8192 for MiB, or 50%)")
    unit = (m.group(2) or "").upper()[:1]
    mib = Decimal(m.group(1)) * _UNITS_MIB[unit]
    if mib > MAX_MEM_MIB:
        raise SpecError(f"{where}: mem {_show(value)} is more than any GPU has (at most {MAX_MEM_MIB} MiB)")
    if mib < 1 or mib != int(mib):
        raise SpecError(f"{where}: mem {_show(value)} must be a whole number of MiB, at least 1")
    return int(mib), None


def _number(key: str, value: str, where: str, percent: bool) -> int:
    """A whole number 1..100 (a percentage: "%" may follow)."""
    v = value.strip().removesuffix("%") if percent else value.strip()
    what = "a whole percentage" if percent else "a whole number"
    if not _INDEX.match(v):
        raise SpecError(f"{where}: {key} '{_show(value)}' is not {what} (1..100)")
    digits = v.lstrip("0") or "0"
    n = int(digits) if len(digits) <= 3 else 1000
    if not 1 <= n <= 100:
        raise SpecError(f"{where}: {key} {_show(v)}{'%' if percent else ''} is outside 1..100")
    return n


def weight(value: str, where: str = "weight") -> int:
    """A weight: 1..100 (a "%" after it, as the old compute= took, is allowed)."""
    return _number("weight", value, where, percent=True)


def cap(value: str, where: str = "cap") -> int:
    """A cap: 1..100 percent, or 0 for "none"/"0" (live changes lift a cap so)."""
    v = value.strip().lower()
    if v in ("none", "0", "0%"):
        return 0
    return _number("cap", value, where, percent=True)


def priority(value: str, where: str = "priority") -> str:
    v = value.strip().lower()
    if v not in PRIORITIES:
        raise SpecError(f"{where}: priority '{_show(value)}' is not one of {', '.join(PRIORITIES)}")
    return v


def _gpu(value: str, where: str) -> str:
    v = value.strip()
    if _INDEX.match(v):
        digits = v.lstrip("0") or "0"
        if len(digits) > 4 or int(digits) > MAX_GPU_INDEX:
            raise SpecError(f"{where}: gpu index {_show(v)} is outside 0..{MAX_GPU_INDEX}")
        return str(int(digits))
    if _UUID.match(v):
        return v
    raise SpecError(f"{where}: gpu '{_show(value)}' is neither an index nor a UUID (GPU-xxxxxxxx-...)")


def oom_script_name(value: str, where: str = "oom-script") -> str:
    """An OOM script as a guest (or the host's command line) names it: a file's name, never a path."""
    v = value.strip()
    if not _SCRIPT_NAME.match(v):
        raise SpecError(
            f"{where}: '{_show(value)}' is not an OOM script's name (letters, digits, '_', '.', '+', '-', "
            "at most 64, not starting with '.'): name a script of the host's OOM-script directory, never a path"
        )
    return v


def peer_timeout(value: str, where: str = "peer-timeout") -> int:
    """A peer timeout in whole seconds, within config.PEER_TIMEOUT_S."""
    v = value.strip().removesuffix("s").strip()
    lo, hi = PEER_TIMEOUT_S
    if not _INDEX.match(v):
        raise SpecError(f"{where}: '{_show(value)}' is not a whole number of seconds")
    digits = v.lstrip("0") or "0"
    if len(digits) > 5 or not lo <= int(digits) <= hi:
        raise SpecError(f"{where}: {_show(v)} s is outside {lo}..{hi} seconds")
    return int(digits)


def _settings(fields: dict[str, str], where: str) -> Settings:
    for k in fields:
        if k in HOST_ONLY:
            raise SpecError(f"{where}: {k}: {HOST_ONLY[k]}")
    unknown = sorted(set(fields) - set(SETTING_KEYS) - set(SLICE_KEYS))
    if unknown:
        raise SpecError(
            f"{where}: unknown setting '{_show(unknown[0])}' (the guest's settings: {', '.join(SETTING_KEYS)})"
        )
    mixed = sorted(set(fields) & set(SLICE_KEYS))
    if mixed:
        raise SpecError(
            f"{where}: {_show(sorted(set(fields) & set(SETTING_KEYS))[0])} is a setting of the guest, not of a "
            f"slice: give the settings in a group of their own (gpu=0,mem=8G;oom-script=NAME)"
        )
    return Settings(
        oom_script_name(fields["oom-script"], f"{where}: oom-script") if "oom-script" in fields else "",
        peer_timeout(fields["peer-timeout"], f"{where}: peer-timeout") if "peer-timeout" in fields else 0,
    )


def _is_settings(fields: dict[str, str]) -> bool:
    return bool(set(fields) & (set(SETTING_KEYS) | set(HOST_ONLY)))


def _slice(fields: dict[str, str], where: str) -> Slice:
    unknown = sorted(set(fields) - set(SLICE_KEYS))
    if unknown:
        raise SpecError(
            f"{where}: unknown field '{_show(unknown[0])}' (fields are {', '.join(SLICE_KEYS)}; "
            f"the guest's settings: {', '.join(SETTING_KEYS)})"
        )
    if "gpu" not in fields:
        raise SpecError(f"{where}: gpu is missing")
    if "mem" not in fields:
        raise SpecError(f"{where}: mem is missing")
    if "compute" in fields and "weight" in fields:
        raise SpecError(f"{where}: compute is the old name of weight: give one of them")
    mem_mib, frac = _mem(fields["mem"], where)
    w = fields.get("weight", fields.get("compute"))
    return Slice(
        _gpu(fields["gpu"], where),
        mem_mib,
        frac,
        _number("weight" if "weight" in fields else "compute", w, where, percent=True)
        if w is not None
        else DEFAULT_WEIGHT,
        _number("guarantee", fields["guarantee"], where, percent=True) if "guarantee" in fields else 0,
        _number("cap", fields["cap"], where, percent=True) if "cap" in fields else 0,
        priority(fields["priority"], where) if "priority" in fields else "normal",
    )


def _check_unique(slices: list[Slice], settings: Settings | None = None) -> ShareSpec:
    if not slices:
        raise SpecError("the share spec has no slice")
    seen: dict[str, int] = {}
    for i, s in enumerate(slices, 1):
        if s.gpu in seen:
            raise SpecError(f"slice {i}: gpu {s.gpu} is already given by slice {seen[s.gpu]}")
        seen[s.gpu] = i
    return ShareSpec(tuple(slices), settings or Settings())


def parse(text: str) -> ShareSpec:
    """Parse the text form (containers' environment variable)."""
    if text is None or not text.strip():
        raise SpecError("the share spec is empty")
    slices, settings = [], None
    for i, part in enumerate(text.strip().strip(";").split(";"), 1):
        where = f"slice {i}"
        fields: dict[str, str] = {}
        for item in part.split(","):
            if not item.strip():
                raise SpecError(f"{where}: empty field")
            if "=" not in item:
                raise SpecError(f"{where}: '{_show(item.strip())}' is not key=value")
            k, v = item.split("=", 1)
            k = k.strip().lower()
            if k in fields:
                raise SpecError(f"{where}: {_show(k)} is given twice")
            fields[k] = v
        if _is_settings(fields):
            if settings is not None:
                raise SpecError(f"group {i}: the guest's settings are already given: give them in one group")
            settings = _settings(fields, f"group {i}")
        else:
            slices.append(_slice(fields, f"slice {len(slices) + 1}"))
    return _check_unique(slices, settings or Settings())


def from_xml(element: ET.Element) -> ShareSpec:
    """Parse the <vmgpu:share> element of a domain's <metadata>."""
    if element.tag != f"{{{XML_NS}}}share":
        raise SpecError(f"expected <share> in namespace {XML_NS}, found {element.tag}")
    slices, settings = [], None
    for el in element:
        fields = {k.lower(): v for k, v in el.attrib.items()}
        if el.tag == f"{{{XML_NS}}}settings":
            if settings is not None:
                raise SpecError("<settings> is given twice: give the guest's settings once")
            settings = _settings(fields, "<settings>")
        elif el.tag == f"{{{XML_NS}}}slice":
            slices.append(_slice(fields, f"slice {len(slices) + 1}"))
        else:
            raise SpecError(f"slice {len(slices) + 1}: unexpected element {_show(str(el.tag))}")
    return _check_unique(slices, settings or Settings())
