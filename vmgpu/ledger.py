"""The admission ledger: who holds how much of which GPU.  SQLite in WAL mode.

Capacity per GPU: its memory in MiB and 100% of guaranteed compute.  A slice's weight, cap
and priority reserve nothing (weights are relative; a cap only limits its guest); its
guarantee does: a GPU's guarantees never sum past 100%.  A guest's request (one slice per
GPU) is validated first (a slice over a card's memory is refused before anything is
reserved) and then admitted all-or-nothing in one immediate transaction: either every slice
is reserved or none is.  Every admission and refusal is logged with the guest's identity.

A slice's columns: compute_pct is the weight it was admitted with (the first schema's name,
when the compute % was both a weight and a reservation), weight the weight set since (NULL:
compute_pct), guarantee_pct, cap_pct (0: none) and priority.  A ledger of that first grammar
is migrated as the old compute= key now reads: its compute % is the guest's weight, and
nothing is reserved (_migrate).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from vmgpu.errors import Conflict, InvalidArgument, LedgerError, NotFound, Refused
from vmgpu.gpu import Gpu
from vmgpu.logging import get_logger
from vmgpu.spec import PRIORITIES, Settings, ShareSpec, SpecError, parse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY,
    idx INTEGER NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    mem_mib INTEGER NOT NULL CHECK (mem_mib > 0),
    compute_pct INTEGER NOT NULL DEFAULT 100
);
CREATE TABLE IF NOT EXISTS guests (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('vm', 'container', 'process')),
    spec TEXT NOT NULL,
    admitted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS forwarders (
    guest TEXT PRIMARY KEY REFERENCES guests(name),
    pid INTEGER NOT NULL,
    region TEXT NOT NULL,
    backend TEXT NOT NULL,
    size TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS slices (
    guest TEXT NOT NULL REFERENCES guests(name) ON DELETE CASCADE,
    gpu TEXT NOT NULL REFERENCES gpus(uuid),
    mem_mib INTEGER NOT NULL CHECK (mem_mib > 0),
    compute_pct INTEGER NOT NULL CHECK (compute_pct BETWEEN 1 AND 100),
    PRIMARY KEY (guest, gpu)
);
"""


# SQLite's error (by name prefix) -> what it means for the ledger file, and what to do
_MOVE_ASIDE = (
    "restore it from a backup, or move it aside and restart vmgpud with an empty ledger (then admit the guests again)"
)
_TROUBLE = (
    ("SQLITE_NOTADB", "is not an SQLite database", _MOVE_ASIDE),
    ("SQLITE_CORRUPT", "is damaged", _MOVE_ASIDE),
    ("SQLITE_FULL", "cannot grow: its disk is full", "free space on its file system; nothing was changed"),
    (
        "SQLITE_READONLY",
        "cannot be written",
        "make it and its directory writable by vmgpud's user (is the file system read-only?)",
    ),
    (
        "SQLITE_CANTOPEN",
        "cannot be opened",
        "check that it and its directory exist and are writable by vmgpud's user (is the file system read-only?)",
    ),
    ("SQLITE_IOERR", "could not be read or written", "check its disk and file system (full? read-only?)"),
    ("SQLITE_BUSY", "is locked by another process", "stop the other process using it (another vmgpud?)"),
)


def ledger_error(path: str, e: sqlite3.Error) -> LedgerError:
    """One line for a failed ledger operation: the file, what is wrong, what to do."""
    name = getattr(e, "sqlite_errorname", "") or ""
    for prefix, what, fix in _TROUBLE:
        if name.startswith(prefix):
            return LedgerError(f"ledger {path} {what} ({e}): {fix}")
    return LedgerError(f"ledger {path}: {e}: check the file and its directory")


def _guarded(fn):
    """SQLite's errors leave as LedgerError (one line that names the file)."""

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except sqlite3.Error as e:
            raise ledger_error(self.path, e) from None

    return call


@dataclass(frozen=True)
class Reservation:
    guest: str
    gpu_index: int
    gpu_uuid: str
    mem_mib: int
    compute_pct: int  # the weight it was admitted with
    kind: str = ""  # vm, container or process
    weight: int = 0  # compute weight: compute_pct unless set
    label: str = ""  # what the operator knows the guest by (a container's docker name)
    guarantee_pct: int = 0  # compute reserved for it, 0: none
    cap_pct: int = 0  # at most this % of its throughput alone, 0: none
    priority: str = "normal"
    settings: str = ""  # the guest's own forwarder settings, text form (spec.Settings.to_text)


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    name: str
    mem_mib: int
    mem_reserved_mib: int
    compute_reserved_pct: int  # the guarantees' sum
    policy: str = "weighted"

    @property
    def mem_free_mib(self) -> int:
        return self.mem_mib - self.mem_reserved_mib

    @property
    def compute_free_pct(self) -> int:
        return 100 - self.compute_reserved_pct


def _settings(spec_text: str) -> Settings:
    """The settings of a spec as the ledger keeps it (written by ShareSpec.to_text)."""
    try:
        return parse(spec_text).settings
    except SpecError:  # a spec an older vmgpud kept that this one reads otherwise: no settings
        return Settings()


def _respelled(spec_text: str) -> str:
    """A kept spec in today's grammar (as admit writes it), or as it is if it does not parse."""
    try:
        return parse(spec_text).to_text()
    except SpecError:
        return spec_text


class Ledger:
    """Every method raises LedgerError (never a raw sqlite3 error) when the file fails it; a
    change is acknowledged (the method returns) only once it is committed."""

    @_guarded
    def __init__(self, path: str | Path):
        self.path = str(path)
        self.log = get_logger(component="ledger")
        # one connection, used by one thread at a time (the daemon serialises its calls)
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA foreign_keys=ON")
            bad = [r[0] for r in self.db.execute("PRAGMA quick_check")]
            if bad != ["ok"]:
                raise LedgerError(f"ledger {self.path} is damaged ({bad[0]}): {_MOVE_ASIDE}")
            self.db.executescript(_SCHEMA)
            self._migrate()
        except BaseException:
            self.db.close()
            raise

    def _migrate(self) -> None:
        """Columns added after the first schema: a ledger from an older vmgpud gains them, in one
        transaction (a crash half-way leaves the ledger as it was)."""
        with self._tx():
            for table, column, decl in (
                ("slices", "weight", "INTEGER CHECK (weight BETWEEN 1 AND 100)"),  # NULL: compute_pct
                ("gpus", "policy", "TEXT NOT NULL DEFAULT 'weighted'"),
                ("forwarders", "geometry", "TEXT NOT NULL DEFAULT ''"),  # JSON: wait, channels, bulk
                ("guests", "label", "TEXT NOT NULL DEFAULT ''"),  # a container's docker name, cleaned
                ("forwarders", "settings", "TEXT NOT NULL DEFAULT ''"),  # JSON: what it was started with
                # the share grammar of weight, guarantee, cap and priority (issue 20):
                ("slices", "guarantee_pct", "INTEGER NOT NULL DEFAULT 0 CHECK (guarantee_pct BETWEEN 0 AND 100)"),
                ("slices", "cap_pct", "INTEGER NOT NULL DEFAULT 0 CHECK (cap_pct BETWEEN 0 AND 100)"),
                ("slices", "priority", "TEXT NOT NULL DEFAULT 'normal' CHECK (priority IN ('high', 'normal', 'low'))"),
            ):
                have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                    if column == "guarantee_pct":
                        self._respell_specs()

    def _respell_specs(self) -> None:
        """The guests' specs of a ledger kept before guarantees, in today's grammar: their compute
        % is their weight (what compute= means now), so a hook that admits one again with the spec
        it was admitted with finds the same share."""
        for name, text in self.db.execute("SELECT name, spec FROM guests").fetchall():
            try:
                new = parse(text).to_text()
            except SpecError:
                continue  # kept as it was: a spec this vmgpud cannot read holds no settings
            self.db.execute("UPDATE guests SET spec = ? WHERE name = ?", (new, name))
            self.log.info("ledger migrated", guest=name, spec=new, was=text)

    def close(self) -> None:
        self.db.close()

    @_guarded
    def sync_gpus(self, gpus: list[Gpu]) -> None:
        """Record the host's GPUs (by UUID; an index or size change is taken as given)."""
        with self._tx():
            for g in gpus:
                self.db.execute(
                    "INSERT INTO gpus (uuid, idx, name, mem_mib) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(uuid) DO UPDATE SET idx = excluded.idx, name = excluded.name, "
                    "mem_mib = excluded.mem_mib",
                    (g.uuid, g.index, g.name, g.memory_mib),
                )

    def _tx(self):
        ledger = self

        class Tx:
            def __enter__(self):
                ledger.db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, exc, tb):
                if exc_type is None:
                    try:
                        ledger.db.execute("COMMIT")
                        return
                    except sqlite3.Error:
                        self._rollback()  # not committed: not acknowledged
                        raise
                self._rollback()

            @staticmethod
            def _rollback():
                if ledger.db.in_transaction:
                    try:
                        ledger.db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite rolled it back itself (disk full, I/O error)

        return Tx()

    def _gpu(self, ref: str, where: str):
        row = (
            self.db.execute("SELECT uuid, idx, mem_mib FROM gpus WHERE idx = ?", (int(ref),)).fetchone()
            if ref.isdigit()
            else self.db.execute("SELECT uuid, idx, mem_mib FROM gpus WHERE uuid = ?", (ref,)).fetchone()
        )
        if row is None:
            known = ", ".join(str(r[0]) for r in self.db.execute("SELECT idx FROM gpus ORDER BY idx"))
            raise NotFound(f"{where}: gpu {ref} is not on this host (GPUs: {known or 'none'})")
        return row

    @_guarded
    def admit(self, guest: str, kind: str, spec: ShareSpec, label: str = "") -> list[Reservation]:
        """Reserve every slice of spec for guest, or none.  Admitting the same guest with
        the same spec again returns its reservations (hooks retry).  label: kept with the guest
        (the caller cleans it: config.label_text)."""
        log = self.log.bind(guest=guest, kind=kind, spec=spec.to_text())
        with self._tx():
            held = self.db.execute("SELECT spec FROM guests WHERE name = ?", (guest,)).fetchone()
            if held is not None:
                if _respelled(held[0]) != spec.to_text():
                    raise Conflict(f"guest {guest} is already admitted with another share ({held[0]})")
                return self.reservations(guest)
            plan = []
            # validation: every slice must fit on an empty card
            for i, s in enumerate(spec.slices, 1):
                uuid, idx, card = self._gpu(s.gpu, f"slice {i}")
                mem = s.mem_for(card)
                if mem > card:
                    log.info("refused", gpu=idx, resource="memory", asked_mib=mem, card_mib=card)
                    raise SpecError(f"slice {i}: mem {mem} MiB is more than GPU {idx} has ({card} MiB)")
                if mem < 1:
                    raise SpecError(f"slice {i}: mem is less than 1 MiB of GPU {idx}")
                plan.append((uuid, idx, mem, s))
            for uuid, idx, mem, sl in plan:
                compute = sl.guarantee
                used_mem, used_cmp = self.db.execute(
                    "SELECT COALESCE(SUM(mem_mib), 0), COALESCE(SUM(guarantee_pct), 0) FROM slices WHERE gpu = ?",
                    (uuid,),
                ).fetchone()
                card = self.db.execute("SELECT mem_mib FROM gpus WHERE uuid = ?", (uuid,)).fetchone()[0]
                if mem > card - used_mem:
                    log.info("refused", gpu=idx, resource="memory", asked_mib=mem, free_mib=card - used_mem)
                    raise Refused(
                        f"guest {guest}: GPU {idx} ({uuid}): memory: asked {mem} MiB, free {card - used_mem} MiB"
                    )
                if compute > 100 - used_cmp:
                    log.info("refused", gpu=idx, resource="guarantee", asked_pct=compute, free_pct=100 - used_cmp)
                    raise Refused(
                        f"guest {guest}: GPU {idx} ({uuid}): compute: asked {compute}%, free {100 - used_cmp}% "
                        "(guarantees; a weight reserves nothing: lower the guarantee or leave it out)"
                    )
            self.db.execute(
                "INSERT INTO guests (name, kind, spec, admitted_at, label) VALUES (?, ?, ?, ?, ?)",
                (guest, kind, spec.to_text(), time.time(), label),
            )
            for uuid, _idx, mem, sl in plan:
                self.db.execute(
                    "INSERT INTO slices (guest, gpu, mem_mib, compute_pct, guarantee_pct, cap_pct, priority) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (guest, uuid, mem, sl.weight, sl.guarantee, sl.cap, sl.priority),
                )
        res = self.reservations(guest)
        log.info(
            "admitted",
            slices=[(r.gpu_index, r.mem_mib, r.weight, r.guarantee_pct, r.cap_pct, r.priority) for r in res],
        )
        return res

    @_guarded
    def set_weight(self, guest: str, gpu: str, weight: int) -> str:
        """The compute weight of guest's slice on gpu (index or UUID); the GPU's UUID."""
        if not 1 <= weight <= 100:
            raise InvalidArgument(f"weight {weight} is not in 1..100")
        with self._tx():
            uuid, idx, _ = self._gpu(gpu, f"weight of {guest}")
            n = self.db.execute(
                "UPDATE slices SET weight = ? WHERE guest = ? AND gpu = ?", (weight, guest, uuid)
            ).rowcount
        if not n:
            raise NotFound(f"guest {guest} holds no slice on gpu {idx}")
        self.log.info("weight set", guest=guest, gpu=idx, weight=weight)
        return uuid

    @_guarded
    def set_cap(self, guest: str, gpu: str, cap: int) -> str:
        """The cap (% of its throughput alone; 0 lifts it) of guest's slice on gpu; the GPU's UUID."""
        if not 0 <= cap <= 100:
            raise InvalidArgument(f"cap {cap}% is not in 0..100 (0: none)")
        return self._set_slice(guest, gpu, "cap_pct", cap, "cap")

    @_guarded
    def set_priority(self, guest: str, gpu: str, priority: str) -> str:
        """The priority (high, normal, low) of guest's slice on gpu; the GPU's UUID."""
        if priority not in PRIORITIES:
            raise InvalidArgument(f"priority '{priority}' is not one of {', '.join(PRIORITIES)}")
        return self._set_slice(guest, gpu, "priority", priority, "priority")

    def _set_slice(self, guest: str, gpu: str, column: str, value, what: str) -> str:
        with self._tx():
            uuid, idx, _ = self._gpu(gpu, f"{what} of {guest}")
            n = self.db.execute(
                f"UPDATE slices SET {column} = ? WHERE guest = ? AND gpu = ?", (value, guest, uuid)
            ).rowcount
        if not n:
            raise NotFound(f"guest {guest} holds no slice on gpu {idx}")
        self.log.info(f"{what} set", guest=guest, gpu=idx, **{what: value})
        return uuid

    @_guarded
    def set_policy(self, gpu: str, policy: str) -> str:
        """The compute policy of gpu (index or UUID); the GPU's UUID."""
        from vmgpu.sched import POLICIES

        if policy not in POLICIES:
            raise InvalidArgument(f"policy '{policy}' is not one of {', '.join(POLICIES)}")
        with self._tx():
            uuid, idx, _ = self._gpu(gpu, "policy")
            self.db.execute("UPDATE gpus SET policy = ? WHERE uuid = ?", (policy, uuid))
        self.log.info("policy set", gpu=idx, policy=policy)
        return uuid

    @_guarded
    def policies(self) -> dict[str, str]:
        """Each GPU's compute policy, by UUID."""
        return dict(self.db.execute("SELECT uuid, policy FROM gpus"))

    @_guarded
    def release(self, guest: str) -> bool:
        """Free everything guest holds.  False if it held nothing (release is idempotent)."""
        with self._tx():
            n = self.db.execute("DELETE FROM guests WHERE name = ?", (guest,)).rowcount
        self.log.info("released" if n else "release: nothing held", guest=guest)
        return bool(n)

    @_guarded
    def reservations(self, guest: str | None = None) -> list[Reservation]:
        q = (
            "SELECT s.guest, g.idx, g.uuid, s.mem_mib, s.compute_pct, c.kind, COALESCE(s.weight, s.compute_pct),"
            " c.label, s.guarantee_pct, s.cap_pct, s.priority, c.spec FROM slices s"
            " JOIN gpus g ON g.uuid = s.gpu JOIN guests c ON c.name = s.guest"
            + (" WHERE s.guest = ?" if guest else "")
            + " ORDER BY s.guest, g.idx"
        )
        rows = self.db.execute(q, (guest,) if guest else ()).fetchall()
        return [Reservation(*r[:-1], settings=_settings(r[-1]).to_text()) for r in rows]

    @_guarded
    def guest_settings(self, guest: str) -> Settings:
        """The forwarder settings guest asked for with its share (none: Settings())."""
        row = self.db.execute("SELECT spec FROM guests WHERE name = ?", (guest,)).fetchone()
        return _settings(row[0]) if row else Settings()

    @_guarded
    def usage(self) -> list[GpuUsage]:
        rows = self.db.execute(
            "SELECT g.idx, g.uuid, g.name, g.mem_mib, COALESCE(SUM(s.mem_mib), 0), COALESCE(SUM(s.guarantee_pct), 0), "
            "g.policy FROM gpus g LEFT JOIN slices s ON s.gpu = g.uuid GROUP BY g.uuid ORDER BY g.idx"
        )
        return [GpuUsage(*r) for r in rows]

    # ---- forwarders (vmgpud's supervisor keeps them here to re-adopt them) ----

    @_guarded
    def record_forwarder(
        self,
        guest: str,
        pid: int,
        region: str,
        backend: str,
        size: str,
        geometry: dict | None = None,
        settings: dict | None = None,
    ) -> None:
        """geometry: the region's wait mode, channels and bulk size (a restart serves it with them);
        settings: the managed settings it was started with (shown by `vmgpu status`)."""
        with self._tx():
            self.db.execute(
                "INSERT OR REPLACE INTO forwarders (guest, pid, region, backend, size, started_at, geometry, "
                "settings) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    guest,
                    pid,
                    region,
                    backend,
                    size or "",
                    time.time(),
                    json.dumps(geometry) if geometry else "",
                    json.dumps(settings) if settings else "",
                ),
            )

    @_guarded
    def forwarder_settings(self, guest: str) -> dict:
        """The managed settings guest's forwarder was started with ({}: none recorded, or by an
        older vmgpud)."""
        row = self.db.execute("SELECT settings FROM forwarders WHERE guest = ?", (guest,)).fetchone()
        return json.loads(row[0]) if row and row[0] else {}

    @_guarded
    def forwarder_geometry(self, guest: str) -> dict | None:
        """The geometry recorded with guest's forwarder, or None (none, or recorded by an older vmgpud)."""
        row = self.db.execute("SELECT geometry FROM forwarders WHERE guest = ?", (guest,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    @_guarded
    def forget_forwarder(self, guest: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM forwarders WHERE guest = ?", (guest,))

    @_guarded
    def forwarder(self, guest: str):
        """(pid, region, backend) of guest's forwarder, or None."""
        return self.db.execute("SELECT pid, region, backend FROM forwarders WHERE guest = ?", (guest,)).fetchone()

    @_guarded
    def forwarders(self) -> list[tuple]:
        return self.db.execute("SELECT guest, pid, region, backend, size FROM forwarders ORDER BY guest").fetchall()
