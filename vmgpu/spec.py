"""Share specs: which GPUs a guest gets, how much memory, what compute weight.

One grammar for containers (an environment variable) and VMs (a namespaced element in
the domain's <metadata>), one validator, the same errors.

Text form (e.g. ``VMGPU="gpu=0,mem=8G,compute=50;gpu=1,mem=25%,compute=30"``):
    spec    := slice (";" slice)*
    slice   := field ("," field)*
    field   := "gpu=" (INDEX | UUID)            required; UUID as nvidia-smi prints it (GPU-...)
             | "mem=" SIZE                      required; 8G, 8192M, 8192 (MiB), or 50% of the card
             | "compute=" PERCENT               optional, 1..100, default 100; "%" may follow
Keys are case-insensitive and whitespace around tokens is ignored.  A GPU appears at most once.

XML form, inside the domain's <metadata>:
    <vmgpu:share xmlns:vmgpu="https://vmgpu.dev/xmlns/share/1">
      <vmgpu:slice gpu="0" mem="8G" compute="50"/>
    </vmgpu:share>
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from decimal import Decimal

from vmgpu.config import UNIT_BYTES
from vmgpu.errors import InvalidArgument, SpecError

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
    compute: int = 100  # percent

    def mem_for(self, card_mib: int) -> int:
        """Memory in MiB on a card of card_mib."""
        if self.mem_mib is not None:
            return self.mem_mib
        return int(card_mib * (self.mem_fraction or 0))

    def to_text(self) -> str:
        mem = f"{self.mem_mib}M" if self.mem_mib is not None else _percent_text(self.mem_fraction or 0)
        return f"gpu={self.gpu},mem={mem},compute={self.compute}"


@dataclass(frozen=True)
class ShareSpec:
    slices: tuple[Slice, ...]

    def to_text(self) -> str:
        return ";".join(s.to_text() for s in self.slices)

    def to_xml(self) -> ET.Element:
        root = ET.Element(f"{{{XML_NS}}}share")
        for s in self.slices:
            el = ET.SubElement(root, f"{{{XML_NS}}}slice")
            el.set("gpu", s.gpu)
            el.set("mem", f"{s.mem_mib}M" if s.mem_mib is not None else _percent_text(s.mem_fraction or 0))
            el.set("compute", str(s.compute))
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


def _compute(value: str, where: str) -> int:
    v = value.strip().removesuffix("%")
    if not _INDEX.match(v):
        raise SpecError(f"{where}: compute '{_show(value)}' is not a whole percentage")
    digits = v.lstrip("0") or "0"
    if len(digits) > 3:
        raise SpecError(f"{where}: compute {_show(v)}% is outside 1..100")
    c = int(digits)
    if not 1 <= c <= 100:
        raise SpecError(f"{where}: compute {c}% is outside 1..100")
    return c


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


def _slice(fields: dict[str, str], where: str) -> Slice:
    unknown = sorted(set(fields) - {"gpu", "mem", "compute"})
    if unknown:
        raise SpecError(f"{where}: unknown field '{_show(unknown[0])}' (fields are gpu, mem, compute)")
    if "gpu" not in fields:
        raise SpecError(f"{where}: gpu is missing")
    if "mem" not in fields:
        raise SpecError(f"{where}: mem is missing")
    mem_mib, frac = _mem(fields["mem"], where)
    compute = _compute(fields["compute"], where) if "compute" in fields else 100
    return Slice(_gpu(fields["gpu"], where), mem_mib, frac, compute)


def _check_unique(slices: list[Slice]) -> ShareSpec:
    if not slices:
        raise SpecError("the share spec has no slice")
    seen: dict[str, int] = {}
    for i, s in enumerate(slices, 1):
        if s.gpu in seen:
            raise SpecError(f"slice {i}: gpu {s.gpu} is already given by slice {seen[s.gpu]}")
        seen[s.gpu] = i
    return ShareSpec(tuple(slices))


def from_options(gpu: str | None, mem: str | None, compute: int, spec_text: str | None) -> ShareSpec:
    """The share of `vmgpu vm attach`: either the whole spec, or one slice's gpu, mem, compute."""
    if spec_text and (gpu or mem):
        raise InvalidArgument("give either --spec or --gpu/--mem/--compute, not both")
    if not spec_text:
        if gpu is None or mem is None:
            raise InvalidArgument("give --gpu and --mem (or --spec)")
        spec_text = f"gpu={gpu},mem={mem},compute={compute}"
    return parse(spec_text)


def parse(text: str) -> ShareSpec:
    """Parse the text form (containers' environment variable)."""
    if text is None or not text.strip():
        raise SpecError("the share spec is empty")
    slices = []
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
        slices.append(_slice(fields, where))
    return _check_unique(slices)


def from_xml(element: ET.Element) -> ShareSpec:
    """Parse the <vmgpu:share> element of a domain's <metadata>."""
    if element.tag != f"{{{XML_NS}}}share":
        raise SpecError(f"expected <share> in namespace {XML_NS}, found {element.tag}")
    slices = []
    for i, el in enumerate(element, 1):
        if el.tag != f"{{{XML_NS}}}slice":
            raise SpecError(f"slice {i}: unexpected element {el.tag}")
        slices.append(_slice({k.lower(): v for k, v in el.attrib.items()}, f"slice {i}"))
    return _check_unique(slices)
