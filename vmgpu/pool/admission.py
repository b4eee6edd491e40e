"""A remote guest's admission to the pool: N slices of one size (the spirit of boyue's
`boyue_VGPU=2 boyue_GMEM=4096 boyue_RATIO=50`, read through vmgpu/dialects.py's translation), on
the least-loaded GPUs of any hosts, reserved in ONE etcd transaction that compares every chosen
GPU's record with what was read (its free memory and compute): every slice or none, and of two
admissions racing for the same memory exactly one wins (the other re-reads and fits elsewhere
or is refused).  The guest gets a random 256-bit token for the data plane; the pool keeps only
its SHA-256, which the host's forwarder checks (verify_token).

A slice's compute is reserved: a GPU's slices never sum past 100%."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import asdict, dataclass, field

from vmgpu import dialects, names
from vmgpu.errors import Conflict, InvalidArgument, LedgerError, Refused, SpecError
from vmgpu.logging import get_logger
from vmgpu.pool import records
from vmgpu.pool.records import GpuRecord, GuestRecord, HostRecord, RecordError, SliceRecord, load_all
from vmgpu.pool.store import GPUS, GUESTS, HOSTS, SLICES, Store
from vmgpu.spec import MAX_MEM_MIB, _mem

# lost compare-and-swaps (other admissions won the GPUs read) before giving up
ATTEMPTS = 20
_TOKEN = re.compile(r"^[0-9a-f]{64}$", re.ASCII)


@dataclass(frozen=True)
class Request:
    """count slices, each of mem_mib MiB (or mem_fraction of its card) and compute_pct % of its GPU."""

    count: int
    mem_mib: int | None
    mem_fraction: float | None
    compute_pct: int

    def mem_on(self, card_mib: int) -> int:
        return self.mem_mib if self.mem_mib is not None else int(card_mib * (self.mem_fraction or 0))

    def text(self) -> str:
        mem = f"{self.mem_mib} MiB" if self.mem_mib is not None else f"{self.mem_fraction:.0%} of a GPU"
        return f"{self.count} slice(s) of {mem} and {self.compute_pct}% compute"


def request(count: int, mem: str, compute_pct: int) -> Request:
    """A request from the command's options (mem: "4096M", "4G", "50%")."""
    if not 1 <= count <= dialects.MAX_GPUS:
        raise InvalidArgument(f"--slices {count} is outside 1..{dialects.MAX_GPUS}")
    if not 1 <= compute_pct <= 100:
        raise InvalidArgument(f"--compute {compute_pct} is outside 1..100 (percent of a GPU)")
    try:
        mib, fraction = _mem(mem, "--mem")
    except SpecError as e:
        raise InvalidArgument(e.message) from None
    return Request(count, mib, fraction, compute_pct)


def request_from_env(env: dict[str, str]) -> Request:
    """boyue's variables (boyue_VGPU, boyue_GMEM, boyue_RATIO) as vmgpu/dialects.py translates
    them: VGPU slices of GMEM MiB (absent: the whole card) and RATIO % (absent: 100)."""
    given = {k: env[k] for k in dialects.BOYUE_VARS if k in env}
    if not given:
        raise InvalidArgument(
            f"no {', '.join(dialects.BOYUE_VARS)} in the environment: set them, or give --slices, --mem, --compute"
        )
    spec = dialects.translate(given).spec
    first = spec.slices[0]
    return Request(len(spec.slices), first.mem_mib, first.mem_fraction, first.weight)


@dataclass
class GrantedSlice:
    host: str
    address: str  # where the host's data plane (vmgpu-netbridge) listens
    port: int
    uuid: str
    index: int
    name: str
    mem_mib: int
    compute_pct: int
    fingerprint: str = ""  # the host's data-plane certificate ("": the host serves no remote guest)


@dataclass
class Grant:
    guest: str
    token: str  # shown once; the pool keeps its SHA-256 only
    slices: list[GrantedSlice] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _hosts(store: Store, log) -> dict[str, HostRecord]:
    entries, _ = store.range(HOSTS)
    return {h.host: h for _, h in load_all(entries, HostRecord.load, log)}


def _grant_slices(guest: str, slices: list[SliceRecord], gpus: dict[str, GpuRecord], hosts) -> list[GrantedSlice]:
    out = []
    for s in slices:
        h, g = hosts.get(s.host), gpus.get(s.uuid)
        out.append(
            GrantedSlice(
                s.host,
                h.address if h else "",
                h.port if h else 0,
                s.uuid,
                g.index if g else -1,
                g.name if g else "",
                s.mem_mib,
                s.compute_pct,
                h.fingerprint if h else "",
            )
        )
    return out


def _refusal(store: Store, req: Request, fit: int, gpus: list[GpuRecord]) -> Refused:
    if not gpus:
        return Refused(f"pool {store.url}: no GPU is registered (hosts join with `vmgpu pool join`)")
    best = max(gpus, key=lambda g: (g.mem_free_mib, g.compute_free_pct))
    return Refused(
        f"pool {store.url}: {req.text()} asked, {fit} GPU(s) have that free; the most free is {best.uuid} on "
        f"{best.host}: {best.mem_free_mib} of {best.mem_mib} MiB, {best.compute_free_pct}% compute"
    )


def admit(store: Store, guest: str, req: Request) -> Grant:
    """Reserve req for guest on the least-loaded GPUs, all or none; its grant, with the token."""
    names.check_guest(guest)
    log = get_logger(guest=guest, pool=store.url)
    token = secrets.token_hex(32)
    digest = token_digest(token)
    for _ in range(ATTEMPTS):
        held = store.get(GUESTS + guest)
        if held is not None:
            try:
                mine = GuestRecord.load(held.json()).token_sha256 == digest
            except (ValueError, RecordError):
                mine = False
            if mine:  # our transaction went through on a member that then failed to answer
                return Grant(guest, token, describe(store, guest)["slices"])
            raise Conflict(
                f"guest {guest} already holds slices in the pool: release it first (vmgpu pool release {guest})"
            )
        hosts = _hosts(store, log)
        gpu_entries, _ = store.range(GPUS)
        gpus = [(e, g) for e, g in load_all(gpu_entries, GpuRecord.load, log) if g.host in hosts]
        fit = [
            (e, g)
            for e, g in gpus
            if 0 < req.mem_on(g.mem_mib) <= min(g.mem_free_mib, MAX_MEM_MIB) and req.compute_pct <= g.compute_free_pct
        ]
        if len(fit) < req.count:
            raise _refusal(store, req, len(fit), [g for _, g in gpus])
        fit.sort(key=lambda eg: (eg[1].load_fraction(), eg[1].host, eg[1].uuid))
        chosen = fit[: req.count]
        compare = [Store.absent(GUESTS + guest)] + [Store.unchanged(e) for e, _ in chosen]
        success = []
        slices = []
        for e, g in chosen:
            mem = req.mem_on(g.mem_mib)
            after = GpuRecord(**{**asdict(g), "mem_free_mib": g.mem_free_mib - mem})
            after.compute_free_pct = g.compute_free_pct - req.compute_pct
            s = SliceRecord(guest, g.uuid, g.host, mem, req.compute_pct)
            slices.append(s)
            success.append(Store.put(e.key, records.to_doc(after), lease=e.lease))
            success.append(Store.put(f"{SLICES}{guest}/{g.uuid}", records.to_doc(s), lease=e.lease))
        record = GuestRecord(guest, digest, [g.uuid for _, g in chosen], time.time())
        success.append(Store.put(GUESTS + guest, records.to_doc(record)))
        if store.txn(compare, success):
            log.info("pool admitted", slices=[f"{s.host}/{s.uuid}:{s.mem_mib}MiB,{s.compute_pct}%" for s in slices])
            return Grant(guest, token, _grant_slices(guest, slices, {g.uuid: g for _, g in chosen}, hosts))
        log.info("pool admission lost a race, reading again")
    raise LedgerError(
        f"pool {store.url}: {ATTEMPTS} attempts to reserve for {guest} lost to other admissions; try again"
    )


def release(store: Store, guest: str) -> bool:
    """Give back everything guest holds in the pool (its slices' memory and compute to their
    GPUs, in one transaction); False: it held nothing."""
    names.check_guest(guest)
    log = get_logger(guest=guest, pool=store.url)
    for _ in range(ATTEMPTS):
        held = store.get(GUESTS + guest)
        slice_entries, _ = store.range(f"{SLICES}{guest}/")
        if held is None and not slice_entries:
            return False
        compare = [Store.unchanged(held)] if held is not None else [Store.absent(GUESTS + guest)]
        success = [Store.delete(GUESTS + guest)] if held is not None else []
        for e in slice_entries:
            compare.append(Store.unchanged(e))
            success.append(Store.delete(e.key))
            try:
                s = SliceRecord.load(e.json())
            except (ValueError, RecordError) as err:
                log.warning("pool slice record removed unread", key=e.key, reason=str(err))
                continue
            gpu_entry = store.get(GPUS + s.uuid)
            if gpu_entry is None:
                continue
            try:
                g = GpuRecord.load(gpu_entry.json())
            except (ValueError, RecordError):
                continue
            if g.host != s.host:
                continue
            g.mem_free_mib = min(g.mem_mib, g.mem_free_mib + s.mem_mib)
            g.compute_free_pct = min(100, g.compute_free_pct + s.compute_pct)
            compare.append(Store.unchanged(gpu_entry))
            success.append(Store.put(gpu_entry.key, records.to_doc(g), lease=gpu_entry.lease))
        if store.txn(compare, success):
            log.info("pool released", slices=len(slice_entries))
            return True
    raise LedgerError(f"pool {store.url}: {ATTEMPTS} attempts to release {guest} lost to other changes; try again")


def describe(store: Store, guest: str) -> dict:
    """guest's slices as they stand (those of a host that died are gone)."""
    log = get_logger(guest=guest, pool=store.url)
    entries, _ = store.range(f"{SLICES}{guest}/")
    slices = [s for _, s in load_all(entries, SliceRecord.load, log)]
    gpu_entries, _ = store.range(GPUS)
    gpus = {g.uuid: g for _, g in load_all(gpu_entries, GpuRecord.load, log)}
    return {"guest": guest, "slices": _grant_slices(guest, slices, gpus, _hosts(store, log))}


@dataclass
class Authorization:
    """The data plane's answer to a guest's token: granted, with the guest's slices on this host."""

    granted: bool
    reason: str
    slices: list[SliceRecord] = field(default_factory=list)


def verify_token(store: Store, guest: str, token: str, host: str) -> Authorization:
    """Whether token is guest's and guest holds a slice on host: what a host's forwarder asks
    before it serves a guest from the network.  The comparison is in constant time."""
    if not names.is_guest(guest):
        return Authorization(False, "not a guest name")
    if not isinstance(token, str) or not _TOKEN.match(token):
        return Authorization(False, f"guest {guest}: the token is not 64 hex digits")
    held = store.get(GUESTS + guest)
    if held is None:
        return Authorization(False, f"guest {guest} is not admitted to the pool")
    try:
        record = GuestRecord.load(held.json())
    except (ValueError, RecordError) as e:
        return Authorization(False, f"guest {guest}: its pool record is not well formed ({e})")
    if not hmac.compare_digest(token_digest(token), record.token_sha256):
        return Authorization(False, f"guest {guest}: wrong token")
    entries, _ = store.range(f"{SLICES}{guest}/")
    log = get_logger(guest=guest, pool=store.url)
    mine = [s for _, s in load_all(entries, SliceRecord.load, log) if s.host == host]
    if not mine:
        return Authorization(False, f"guest {guest} holds no slice on host {host} (none granted, or it expired)")
    return Authorization(True, "", mine)
