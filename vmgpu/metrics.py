"""vmgpud's Prometheus endpoint: what the ledger holds, read at scrape time, and counters of
admission decisions."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily

from vmgpu.ledger import Ledger


class LedgerCollector:
    def __init__(self, ledger: Ledger, lock: threading.Lock):
        self.ledger, self.lock = ledger, lock

    def collect(self):
        with self.lock:
            usage, slices, fwds = self.ledger.usage(), self.ledger.reservations(), self.ledger.forwarders()
        mem = GaugeMetricFamily("vmgpu_gpu_memory_mib", "GPU memory, MiB", labels=["gpu", "uuid", "state"])
        cmp = GaugeMetricFamily(
            "vmgpu_gpu_compute_reserved_percent", "Compute reserved on a GPU", labels=["gpu", "uuid"]
        )
        for u in usage:
            mem.add_metric([str(u.index), u.uuid, "total"], u.mem_mib)
            mem.add_metric([str(u.index), u.uuid, "reserved"], u.mem_reserved_mib)
            cmp.add_metric([str(u.index), u.uuid], u.compute_reserved_pct)
        gmem = GaugeMetricFamily(
            "vmgpu_guest_memory_quota_mib", "A guest's memory quota on a GPU", labels=["guest", "gpu"]
        )
        gcmp = GaugeMetricFamily(
            "vmgpu_guest_compute_percent", "A guest's compute share on a GPU", labels=["guest", "gpu"]
        )
        for r in slices:
            gmem.add_metric([r.guest, str(r.gpu_index)], r.mem_mib)
            gcmp.add_metric([r.guest, str(r.gpu_index)], r.compute_pct)
        up = GaugeMetricFamily("vmgpu_forwarders", "Forwarders vmgpud supervises")
        up.add_metric([], len(fwds))
        yield from (mem, cmp, gmem, gcmp, up)


class Metrics:
    """The registry vmgpud exports; `admissions` counts decisions by result."""

    def __init__(self, ledger: Ledger, lock: threading.Lock):
        self.registry = CollectorRegistry()
        self.registry.register(LedgerCollector(ledger, lock))
        self.admissions = Counter("vmgpu_admissions", "Admission decisions", ["result"], registry=self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Start the HTTP endpoint; returns the server (its port is server.server_port)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
