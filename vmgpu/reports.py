"""What `vmgpu` reports, as plain data (what --json prints; vmgpu/cli/render.py draws the
tables): an admission's slices, vmgpud's status with the share of GPU time each guest gets now
(sampled from the schedulers' pages), and where a guest's time goes (a forwarder's statistics)."""

from __future__ import annotations

import time


def admitted(reply) -> list[dict]:
    """An AdmitReply's slices."""
    return [
        {"gpu": s.gpu_index, "uuid": s.gpu_uuid, "mem_mib": s.mem_mib, "compute_pct": s.compute_pct}
        for s in reply.slices
    ]


def achieved_compute(uuids: set[str], sample_s: float = 0.3) -> dict[tuple[str, str], float]:
    """Each guest's share of each GPU's time over a short sample, from the schedulers' pages."""
    from vmgpu import sched

    pages = []
    for u in uuids:
        try:
            pages.append((u, sched.Page(sched.page_path(u))))
        except sched.SchedError:
            continue
    if not pages:
        return {}
    t0, before = time.monotonic_ns(), {(u, m.guest): m.used_ns for u, p in pages for m in p.members()}
    time.sleep(sample_s)
    t1, after = time.monotonic_ns(), {(u, m.guest): m.used_ns for u, p in pages for m in p.members()}
    for _, p in pages:
        p.close()
    return {k: 100 * (v - before.get(k, v)) / (t1 - t0) for k, v in after.items()}


def status(reply, achieved: dict[tuple[str, str], float]) -> dict:
    """A StatusReply with the compute each guest achieved (achieved_compute)."""
    return {
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "mem_mib": g.mem_mib,
                "mem_reserved_mib": g.mem_reserved_mib,
                "compute_reserved_pct": g.compute_reserved_pct,
                "policy": g.policy,
            }
            for g in reply.gpus
        ],
        "guests": [
            {
                "guest": s.guest,
                "kind": s.kind,
                "gpu": s.gpu_index,
                "mem_mib": s.mem_mib,
                "compute_pct": s.compute_pct,
                "weight": s.weight,
                "compute_achieved_pct": achieved.get((s.gpu_uuid, s.guest)),
            }
            for s in reply.slices
        ],
        "forwarders": [
            {
                "guest": f.guest,
                "pid": f.pid,
                "region": f.region,
                "backend": f.backend,
                "mem_used_mib": list(f.mem_used_mib),
                "processes": f.processes,
                "sync_calls": f.sync_calls,
                "async_calls": f.async_calls,
                "state": f.state or "running",
                "restart_attempt": f.restart_attempt,
                "restart_error": f.restart_error,
            }
            for f in reply.forwarders
        ],
    }


def breakdown(stats_file: str, interval: float = 0.0) -> dict:
    """A forwarder's statistics page: since it started, or what happens in the next interval s."""
    from vmgpu import stats

    a = stats.read(stats_file)
    if interval > 0:
        time.sleep(interval)
        return stats.delta(a, stats.read(stats_file))
    return {**a, "seconds": None}
