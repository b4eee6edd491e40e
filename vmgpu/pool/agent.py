"""`vmgpu pool join`: a host in the pool.  It registers the host (its data-plane address and
port) and its GPUs under one etcd lease, and renews the lease every third of its TTL for as long
as it runs.  When it stops renewing (the agent killed, the host down, its link to etcd cut for
longer than the TTL) etcd deletes the host, its GPUs and the slices guests held on them.

A restarted agent finds its host's lease still alive (within the TTL) and keeps it: the GPUs'
free memory and the guests' slices on them stay as they were.  A lease that expired meanwhile
is gone with its keys; the agent registers the host afresh (its GPUs all free)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from vmgpu import gpu as gpus_of_host
from vmgpu import names
from vmgpu.errors import Conflict, LedgerError
from vmgpu.logging import get_logger
from vmgpu.pool import records
from vmgpu.pool.records import GpuRecord, HostRecord, RecordError
from vmgpu.pool.store import GPUS, HOSTS, Store

DEFAULT_TTL_S = 10
DEFAULT_PORT = 7471


@dataclass(frozen=True)
class Membership:
    host: str
    address: str
    port: int
    ttl_s: int


class Agent:
    def __init__(self, store: Store, membership: Membership, inventory: list[gpus_of_host.Gpu], dataplane=None):
        names.check_guest(membership.host, "host name")
        self.dataplane = dataplane  # vmgpu.pool.dataplane.DataPlane: serve remote guests (None: not)
        self.fingerprint = ""
        self.store = store
        self.me = membership
        self.gpus = inventory
        self.lease = 0
        self.stop = threading.Event()
        self.log = get_logger(host=membership.host, pool=store.url)

    def _record(self) -> HostRecord:
        rec = HostRecord(
            self.me.host,
            self.me.address,
            self.me.port,
            self.lease,
            self.me.ttl_s,
            [g.uuid for g in self.gpus],
            self.fingerprint,
        )
        rec.check()
        return rec

    def register(self) -> int:
        """The host and its GPUs in the pool under a live lease (the one it had, if alive); the lease."""
        held = self.store.get(HOSTS + self.me.host)
        lease = 0
        if held is not None:
            try:
                old = HostRecord.load(held.json())
                if self.store.time_to_live(old.lease) > 0:
                    lease = old.lease
            except (ValueError, RecordError) as e:
                self.log.warning("pool host record replaced", reason=str(e))
        adopted = bool(lease)
        self.lease = lease or self.store.grant(self.me.ttl_s)
        compare, success = [], [Store.put(HOSTS + self.me.host, records.to_doc(self._record()), lease=self.lease)]
        for g in self.gpus:
            records.check_uuid(g.uuid)
            key = GPUS + g.uuid
            entry = self.store.get(key)
            if entry is not None:
                try:
                    other = GpuRecord.load(entry.json()).host
                except (ValueError, RecordError):
                    other = "?"
                if other != self.me.host:
                    raise Conflict(
                        f"GPU {g.uuid} is registered in the pool by host {other}: one GPU, one host "
                        "(check the inventories, or wait for that host's lease to expire)"
                    )
                if adopted and entry.lease == self.lease:
                    continue  # kept with its free memory and the slices on it
            compare.append(Store.absent(key) if entry is None else Store.unchanged(entry))
            rec = GpuRecord(g.uuid, self.me.host, g.index, g.name[:100], g.memory_mib, g.memory_mib, 100)
            rec.check()
            success.append(Store.put(key, records.to_doc(rec), lease=self.lease))
        if not self.store.txn(compare, success):
            raise LedgerError(f"pool {self.store.url}: host {self.me.host}'s GPUs changed while it joined; join again")
        self.log.info(
            "pool joined",
            address=f"{self.me.address}:{self.me.port}",
            gpus=len(self.gpus),
            lease=self.lease,
            adopted=adopted,
            ttl_s=self.me.ttl_s,
        )
        return self.lease

    def run(self) -> None:
        """Register, then renew the lease until stop is set; a lease found expired (the host was
        cut off longer than its TTL: its GPUs and slices are gone) is replaced by a fresh
        registration; an etcd that does not answer is asked again.  With a data plane, each
        renewal also serves exactly the guests that hold slices here (a forwarder each), and
        stopping stops them."""
        if self.dataplane is not None:
            self.fingerprint = self.dataplane.start()
        try:
            self.register()
            period = max(self.me.ttl_s / 3, 0.2)
            while True:
                if self.dataplane is not None:
                    self.dataplane.reconcile(self.store)
                if self.stop.wait(period):
                    break
                try:
                    if self.store.keep_alive(self.lease) <= 0:
                        self.log.error("pool lease expired: this host's GPUs and slices were dropped; joining again")
                        self.register()
                except LedgerError as e:
                    self.log.warning("pool lease not renewed", reason=e.message)
        finally:
            if self.dataplane is not None:
                self.dataplane.stop()

    def leave(self) -> None:
        """Out of the pool now: the lease revoked, the host's GPUs and the slices on them gone."""
        if self.lease:
            self.store.revoke(self.lease)
            self.log.info("pool left", lease=self.lease)


def leave(store: Store, host: str) -> bool:
    """Take host out of the pool now (its lease revoked); False: it was not in it."""
    names.check_guest(host, "host name")
    held = store.get(HOSTS + host)
    if held is None:
        return False
    store.revoke(held.lease)
    return True
