"""vmgpud's Prometheus endpoint, everything read at scrape time: what the ledger holds
(capacity, reservations, quotas, each guest's compute weight, guarantee, cap and priority), what
the guests use (each forwarder's statistics page: memory used, time its calls waited at the
compute gate, memory refusals; each GPU's scheduler page: GPU time held), forwarders restarted by
the supervisor, shared GPUs whose guests are held by time rather than on SM spans (and the guests
whose work left their spans), and counters of admission decisions.

Labels: guest (its name), gpu (the host's GPU index), uuid (the GPU's UUID).  A guest's usage is
shown while its forwarder runs; its counters start again from 0 when a forwarder is started
again (Prometheus's rate() and increase() take such resets in their stride), and at no other
time (GpuTimeCounters)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from vmgpu import sched
from vmgpu.ledger import Ledger

NS = 1e9


class LedgerCollector:
    def __init__(self, ledger: Ledger, lock: threading.Lock):
        self.ledger, self.lock = ledger, lock

    def collect(self):
        with self.lock:
            usage, slices, fwds = self.ledger.usage(), self.ledger.reservations(), self.ledger.forwarders()
        mem = GaugeMetricFamily("vmgpu_gpu_memory_mib", "GPU memory, MiB", labels=["gpu", "uuid", "state"])
        cmp = GaugeMetricFamily(
            "vmgpu_gpu_compute_reserved_percent",
            "Compute reserved on a GPU: its guests' guarantees",
            labels=["gpu", "uuid"],
        )
        for u in usage:
            mem.add_metric([str(u.index), u.uuid, "total"], u.mem_mib)
            mem.add_metric([str(u.index), u.uuid, "reserved"], u.mem_reserved_mib)
            cmp.add_metric([str(u.index), u.uuid], u.compute_reserved_pct)
        gmem = GaugeMetricFamily(
            "vmgpu_guest_memory_quota_mib", "A guest's memory quota on a GPU", labels=["guest", "gpu"]
        )
        # a slice's compute share, each field as the share grammar names it (vmgpu/spec.py)
        weight = GaugeMetricFamily(
            "vmgpu_guest_compute_weight",
            "A guest's compute weight on a GPU, 1..100, relative to the other guests' (reserves nothing)",
            labels=["guest", "gpu"],
        )
        guarantee = GaugeMetricFamily(
            "vmgpu_guest_compute_guarantee_percent",
            "The share of a GPU's time reserved for a guest at admission (0: none)",
            labels=["guest", "gpu"],
        )
        cap = GaugeMetricFamily(
            "vmgpu_guest_compute_cap_percent",
            "The most of its throughput alone on a GPU a guest may have (only guests with a cap appear)",
            labels=["guest", "gpu"],
        )
        priority = GaugeMetricFamily(
            "vmgpu_guest_compute_priority",
            "A guest's priority on a GPU, as its label (high, normal, low); the value is always 1",
            labels=["guest", "gpu", "priority"],
        )
        for r in slices:
            key = [r.guest, str(r.gpu_index)]
            gmem.add_metric(key, r.mem_mib)
            weight.add_metric(key, r.weight)
            guarantee.add_metric(key, r.guarantee_pct)
            if r.cap_pct:
                cap.add_metric(key, r.cap_pct)
            priority.add_metric([*key, r.priority], 1)
        up = GaugeMetricFamily("vmgpu_forwarders", "Forwarders vmgpud supervises")
        up.add_metric([], len(fwds))
        yield from (mem, cmp, gmem, weight, guarantee, cap, priority, up)


class UsageCollector:
    """What guests use, from the pages their forwarders keep: a forwarder's statistics page
    counts per guest GPU (the order of --gpus, which is the ledger's order of the guest's
    slices); a GPU's scheduler page holds each member's GPU time."""

    def __init__(self, ledger: Ledger, lock: threading.Lock, supervisor):
        self.ledger, self.lock, self.supervisor = ledger, lock, supervisor
        self.gpu_times = GpuTimeCounters()

    def collect(self):
        labels = ["guest", "gpu", "uuid"]
        used = GaugeMetricFamily(
            "vmgpu_guest_memory_used_bytes", "GPU memory a guest holds now (its forwarder's charges)", labels=labels
        )
        gpu_time = CounterMetricFamily(
            "vmgpu_guest_gpu_time_seconds", "Time a guest held the GPU (its compute scheduler's turns)", labels=labels
        )
        throttled = CounterMetricFamily(
            "vmgpu_guest_throttled_seconds",
            "Time a guest's calls waited at the GPU's compute gate for its turn",
            labels=labels,
        )
        ooms = CounterMetricFamily(
            "vmgpu_guest_oom_refusals",
            "Allocations, contexts and module images refused for a guest's memory quota or a full card",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            "vmgpu_forwarder_restarts", "A guest's forwarder started again after it died", labels=["guest"]
        )
        by_time = GaugeMetricFamily(
            "vmgpu_gpu_held_by_time",
            "1 for a shared GPU whose guests are held by time, not on SM spans, and why",
            labels=["gpu", "uuid", "why"],
        )
        off_span = GaugeMetricFamily(
            "vmgpu_guest_off_span",
            "1 for a guest whose work is off its SM span, which has every guest on its GPU held by time",
            labels=["guest", "gpu", "uuid"],
        )
        with self.lock:
            usage, fwds = self.ledger.usage(), self.ledger.forwarders()
            slices = {g: self.ledger.reservations(g) for g, *_ in fwds}
            admitted = {r.guest for r in self.ledger.reservations()}
            restarted = dict(self.supervisor.restarted)
        for guest, pid, region, _backend, _size in fwds:
            if self.supervisor.state(guest, pid, region)[0] != "running":
                continue
            st = self.supervisor.stats(guest)
            if not st:
                continue
            for i, r in enumerate(slices[guest][: len(st["memory"])]):
                key = [guest, str(r.gpu_index), r.gpu_uuid]
                used.add_metric(key, st["memory"][i]["used"])
                throttled.add_metric(key, st["throttled_ns"][i] / NS)
                ooms.add_metric(key, st["oom_refusals"][i])
        for u in usage:
            for guest, ns in self.gpu_times.take(u.uuid, _gpu_time(u.uuid)).items():
                gpu_time.add_metric([guest, str(u.index), u.uuid], ns / NS)
        for guest in sorted({g for g, *_ in fwds} | (set(restarted) & admitted)):
            restarts.add_metric([guest], restarted.get(guest, 0))
        held = dict(getattr(self.supervisor, "held_by_time", {}))
        for u in usage:
            if u.uuid in held:
                why, guests = held[u.uuid]
                by_time.add_metric([str(u.index), u.uuid, why], 1)
                for guest in guests if why == "its work off its span" else ():
                    off_span.add_metric([guest, str(u.index), u.uuid], 1)
        yield from (used, gpu_time, throttled, ooms, restarts, by_time, off_span)


def _gpu_time(uuid: str) -> dict[sched.Seat, int]:
    """ns each member of the GPU's scheduler page has held it, by its seat, the turn held now
    included (a guest alone and busy keeps its turn); none: no forwarder made the page."""
    try:
        page = sched.Page(sched.page_path(uuid))
    except (sched.SchedError, OSError):
        return {}
    with page:
        return page.gpu_time_by_seat()[1]


class GpuTimeCounters:
    """Each guest's GPU time on each GPU as a counter that never steps back while its seats on the
    GPU's page stay (the same forwarders, seated once): a look may count more than is charged
    later (the idle end of a turn the forwarder passes over: sched_rest; a look at a forwarder
    that keeps no time_seq caught in a change), and a counter that stepped back would read as a
    reset, its whole value a spike in rate().  So a look below the last one exported is exported
    as the last one until the time catches up.  Where the seats changed (a forwarder started
    again: its time from 0) the look is taken as it is, a reset where it is less.  Scrapes may come
    on several threads at once."""

    def __init__(self):
        self.last: dict[tuple[str, str], tuple[frozenset[sched.Seat], int]] = {}
        self.lock = threading.Lock()

    def take(self, uuid: str, by_seat: dict[sched.Seat, int]) -> dict[str, int]:
        """{guest: ns} to export for the GPU with this UUID, from a look at its page by seat."""
        seats: dict[str, set[sched.Seat]] = {}
        ns: dict[str, int] = {}
        for seat, t in by_seat.items():
            seats.setdefault(seat.guest, set()).add(seat)
            ns[seat.guest] = ns.get(seat.guest, 0) + t
        with self.lock:
            for key in [k for k in self.last if k[0] == uuid and k[1] not in ns]:
                del self.last[key]  # gone from the page: a guest that comes back starts from 0
            for guest, t in ns.items():
                held, before = self.last.get((uuid, guest), (frozenset(), 0))
                if held == seats[guest] and t < before:
                    ns[guest] = t = before
                self.last[(uuid, guest)] = (frozenset(seats[guest]), t)
        return ns


class Metrics:
    """The registry vmgpud exports; `admissions` counts decisions by result.  supervisor: the
    forwarders whose usage is exported (None: the ledger's numbers only)."""

    def __init__(self, ledger: Ledger, lock: threading.Lock, supervisor=None):
        self.registry = CollectorRegistry()
        self.registry.register(LedgerCollector(ledger, lock))
        if supervisor is not None:
            self.registry.register(UsageCollector(ledger, lock, supervisor))
        self.admissions = Counter("vmgpu_admissions", "Admission decisions", ["result"], registry=self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Start the HTTP endpoint; returns the server (its port is server.server_port)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
