"""What each of the pool's keys holds (vmgpu/pool/store.py has the layout), and its check when
read: a record is written by another host's vmgpu, so a value that is not what it should be
(a field missing, of another type, out of range, a name that could not be a key) is refused as
a whole with RecordError, and the reader leaves it out and says so, never trusts half of it."""

from __future__ import annotations

import re
from dataclasses import MISSING, asdict, dataclass, fields

from vmgpu import names

_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,79}$", re.ASCII)
_HEX64 = re.compile(r"^[0-9a-f]{64}$", re.ASCII)
MAX_MIB = 1 << 40


class RecordError(ValueError):
    """A pool record that is not well formed."""


def check_uuid(uuid: object) -> str:
    if not isinstance(uuid, str) or not _UUID.match(uuid):
        raise RecordError(f"GPU UUID {str(uuid)[:40]!r} is not one (letters, digits and '-')")
    return uuid


def _name(value: object, what: str) -> str:
    try:
        return names.check_guest(value, what)
    except Exception as e:
        raise RecordError(getattr(e, "message", str(e))) from None


def _number(value: object, what: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise RecordError(f"{what} {str(value)[:20]!r} is not a whole number in {lo}..{hi}")
    return value


def _text(value: object, what: str, most: int = 200) -> str:
    if not isinstance(value, str) or len(value) > most or not value.isprintable():
        raise RecordError(f"{what} is not printable text of at most {most} characters")
    return value


def _load(cls, doc: object):
    if not isinstance(doc, dict):
        raise RecordError(f"a {cls.__name__} record is not a JSON object")
    want = {f.name for f in fields(cls)}
    # a field added later has a default: a record an older vmgpu wrote lacks it and is still whole
    missing = {f.name for f in fields(cls) if f.default is MISSING} - set(doc)
    if missing:
        raise RecordError(f"a {cls.__name__} record lacks {', '.join(sorted(missing))}")
    out = cls(**{k: doc[k] for k in want if k in doc})
    out.check()
    return out


class _Record:
    def check(self) -> None:
        raise NotImplementedError

    @classmethod
    def load(cls, doc: object):
        """The record of a decoded JSON value, checked; RecordError if it is not one."""
        return _load(cls, doc)


@dataclass
class HostRecord(_Record):
    host: str
    address: str  # the data plane's address (the forwarder a guest will reach)
    port: int
    lease: int
    ttl_s: int
    gpus: list[str]
    fingerprint: str = ""  # SHA-256 of its data plane's certificate ("": it serves no remote guest)

    def check(self) -> None:
        if not isinstance(self.fingerprint, str) or (self.fingerprint and not _HEX64.match(self.fingerprint)):
            raise RecordError("fingerprint is not 64 hex digits")
        _name(self.host, "host name")
        _text(self.address, "address", 64)
        _number(self.port, "port", 1, 65535)
        _number(self.lease, "lease", 1, (1 << 63) - 1)
        _number(self.ttl_s, "lease TTL", 1, 3600)
        if not isinstance(self.gpus, list) or len(self.gpus) > 64:
            raise RecordError("gpus is not a list of at most 64 UUIDs")
        for u in self.gpus:
            check_uuid(u)


@dataclass
class GpuRecord(_Record):
    uuid: str
    host: str
    index: int
    name: str
    mem_mib: int
    mem_free_mib: int
    compute_free_pct: int

    def check(self) -> None:
        check_uuid(self.uuid)
        _name(self.host, "host name")
        _number(self.index, "GPU index", 0, 1023)
        _text(self.name, "GPU name", 100)
        _number(self.mem_mib, "memory", 1, MAX_MIB)
        _number(self.mem_free_mib, "free memory", 0, self.mem_mib)
        _number(self.compute_free_pct, "free compute", 0, 100)

    def load_fraction(self) -> tuple[float, int]:
        """How loaded it is: the share of its memory reserved, then of its compute (least first)."""
        return (1 - self.mem_free_mib / self.mem_mib, 100 - self.compute_free_pct)


@dataclass
class SliceRecord(_Record):
    guest: str
    uuid: str
    host: str
    mem_mib: int
    compute_pct: int

    def check(self) -> None:
        _name(self.guest, "guest name")
        check_uuid(self.uuid)
        _name(self.host, "host name")
        _number(self.mem_mib, "memory", 1, MAX_MIB)
        _number(self.compute_pct, "compute", 0, 100)


@dataclass
class GuestRecord(_Record):
    guest: str
    token_sha256: str  # the data plane's token is never stored, only its hash
    slices: list[str]  # GPU UUIDs
    admitted_at: float

    def check(self) -> None:
        _name(self.guest, "guest name")
        if not isinstance(self.token_sha256, str) or not _HEX64.match(self.token_sha256):
            raise RecordError("token_sha256 is not 64 hex digits")
        if not isinstance(self.slices, list) or not 0 < len(self.slices) <= 64:
            raise RecordError("slices is not a list of 1 to 64 UUIDs")
        for u in self.slices:
            check_uuid(u)
        if not isinstance(self.admitted_at, int | float):
            raise RecordError("admitted_at is not a time")


def load_all(entries, load, log) -> list:
    """(entry, record) for each entry load accepts; the others left out, each with a warning."""
    out = []
    for e in entries:
        try:
            out.append((e, load(e.json())))
        except (ValueError, RecordError) as err:
            log.warning("pool record left out", key=e.key, reason=str(err))
    return out


def to_doc(record) -> dict:
    return asdict(record)
