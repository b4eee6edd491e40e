"""What `vmgpu pool status` shows, as data: every host (address, lease time left), every GPU
(memory reserved of total, compute reserved) and every guest (its slices; a slice whose host's
lease expired is shown lost)."""

from __future__ import annotations

from dataclasses import asdict

from vmgpu.logging import get_logger
from vmgpu.pool.records import GpuRecord, GuestRecord, HostRecord, SliceRecord, load_all
from vmgpu.pool.store import GPUS, GUESTS, HOSTS, SLICES, Store


def pool_status(store: Store) -> dict:
    log = get_logger(pool=store.url)
    hosts = [h for _, h in load_all(store.range(HOSTS)[0], HostRecord.load, log)]
    gpus = [g for _, g in load_all(store.range(GPUS)[0], GpuRecord.load, log)]
    slices = [s for _, s in load_all(store.range(SLICES)[0], SliceRecord.load, log)]
    guests = [g for _, g in load_all(store.range(GUESTS)[0], GuestRecord.load, log)]
    out_hosts = []
    for h in sorted(hosts, key=lambda h: h.host):
        d = asdict(h)
        d["lease_left_s"] = store.time_to_live(h.lease)
        out_hosts.append(d)
    out_gpus = []
    for g in sorted(gpus, key=lambda g: (g.host, g.index)):
        d = asdict(g)
        d["mem_reserved_mib"] = g.mem_mib - g.mem_free_mib
        d["compute_reserved_pct"] = 100 - g.compute_free_pct
        d["guests"] = sorted(s.guest for s in slices if s.uuid == g.uuid)
        out_gpus.append(d)
    out_guests = []
    for r in sorted(guests, key=lambda r: r.guest):
        held = {s.uuid: s for s in slices if s.guest == r.guest}
        rows = []
        for uuid in r.slices:
            s = held.get(uuid)
            rows.append(
                asdict(s) | {"state": "held"} if s else {"uuid": uuid, "state": "lost (its host left the pool)"}
            )
        out_guests.append({"guest": r.guest, "admitted_at": r.admitted_at, "slices": rows})
    return {"pool": store.url, "hosts": out_hosts, "gpus": out_gpus, "guests": out_guests}
