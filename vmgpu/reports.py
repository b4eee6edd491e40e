"""What `vmgpu` reports, as plain data (what --json prints; vmgpu/cli/render.py draws the
tables): an admission's slices, vmgpud's status with the share of GPU time each guest gets now
(sampled from the schedulers' pages), and where a guest's time goes (a forwarder's statistics)."""

from __future__ import annotations

import time

from vmgpu.config import label_text


def admitted(reply) -> list[dict]:
    """An AdmitReply's slices."""
    return [
        {"gpu": s.gpu_index, "uuid": s.gpu_uuid, "mem_mib": s.mem_mib, "compute_pct": s.compute_pct, **share(s)}
        for s in reply.slices
    ]


def share(s) -> dict:
    """A Slice's compute share: weight, guarantee and cap in % (0: none), priority."""
    return {
        "weight": s.weight or s.compute_pct,
        "guarantee_pct": s.guarantee_pct,
        "cap_pct": s.cap_pct,
        "priority": s.priority or "normal",
    }


class ComputeSampler:
    """Each guest's share of each GPU's time between two looks at the GPUs' scheduler pages
    (sched.Page.gpu_time: the turn a guest holds now counts, so a busy guest alone on a GPU
    shows ~100%).  Under the native and shared policies no turns are taken and nothing is
    metered: their guests get None.  Under shared, `held` has what the share controller holds
    each guest to at the last look: {(GPU UUID, guest): (% of each period held, depth or None, %
    of the SMs its span is or None, whether its work was off its span in the last second on a
    partitioned GPU, which has every guest there held by time)}; under every policy, `cap_parts` the part of each period
    vmgpud's cap controller lets a capped guest's work have, where it holds one now: {(GPU UUID,
    guest): % of each period (100: its rate alone being measured)}."""

    def __init__(self, uuids: set[str]):
        self.uuids = set(uuids)
        self.last: dict[str, tuple[int, dict[str, int]]] = {}
        self.held: dict[tuple[str, str], tuple[float, int | None, float | None]] = {}
        self.cap_parts: dict[tuple[str, str], float] = {}
        self.shares: dict[tuple[str, str], float | None] = {}  # the last take's

    def _look(self) -> dict[str, tuple[int, dict[str, int]] | None]:
        from vmgpu import sched

        out: dict[str, tuple[int, dict[str, int]] | None] = {}
        self.held, self.cap_parts = {}, {}
        for u in self.uuids:
            try:
                page = sched.Page(sched.page_path(u))
            except sched.SchedError:
                continue
            with page:
                policy = page.policy
                out[u] = None if policy in ("native", "shared") else page.gpu_time()
                self.cap_parts.update(
                    {
                        (u, m.guest): min(m.cap_pm, 1000) / 10
                        for m in page.members()
                        if m.cap_pm and m.capped(policy) and page.caps_fresh(probe=m.cap_pm >= 1000)
                    }
                )
                if policy == "shared":
                    groups, now_ms = page.sm_groups, int(1000 * time.monotonic()) & 0xFFFFFFFF
                    for m in page.members():
                        lo, hi = m.sm_part >> 16, m.sm_part & 0xFFFF
                        sms = 100 * (hi - lo) / (16 * groups) if groups and hi > lo else None
                        # (off its span: where the GPU is partitioned, its work left its span)
                        off = bool(groups) and m.off_span(now_ms)
                        self.held[(u, m.guest)] = (m.hold / 10, m.depth or None, sms, off)
        return out

    def take(self) -> dict[tuple[str, str], float | None]:
        """{(GPU UUID, guest): % of the GPU's time it held since the last take} (the first take
        only starts the count: it answers {})."""
        looks, shares = self._look(), {}
        for u, look in looks.items():
            prev = self.last.get(u)
            if look is None:  # native or shared: no turns, no GPU time counted
                shares.update({(u, g): None for g in (prev[1] if prev else {})})
                self.last.pop(u, None)
                continue
            now, used = look
            if prev is not None and now > prev[0]:
                for g, ns in used.items():
                    was = prev[1].get(g, ns)  # a guest that joined since starts counting now
                    shares[(u, g)] = min(100.0, max(0.0, 100 * (ns - was) / (now - prev[0])))
            self.last[u] = look
        self.shares = shares
        return shares


def achieved_compute(uuids: set[str], sample_s: float = 0.3) -> ComputeSampler:
    """Each guest's share of each GPU's time over a short sample, from the schedulers' pages: the
    sampler after its second look (its `shares`, and `held` under shared)."""
    sampler = ComputeSampler(uuids)
    sampler.take()
    if sampler.last:  # (a GPU that meters turns: sample them)
        time.sleep(sample_s)
    sampler.take()
    return sampler


HELD_KEYS = ("held_pct", "held_depth", "held_sms_pct", "held_off_span")  # a guest's ComputeSampler.held, in status()


def status(
    reply, achieved: dict[tuple[str, str], float], held: dict | None = None, cap_parts: dict | None = None
) -> dict:
    """A StatusReply with the compute each guest achieved (ComputeSampler.take) and, under the
    shared policy, what the share controller holds it to (ComputeSampler.held): the % of each
    period its work waits, its depth where one is set, the % of the GPU's SMs its span is where
    it has one, and whether its work is off its span (held_pct / held_depth / held_sms_pct /
    held_off_span, else None); and the part of each period the
    cap controller lets a capped guest have where it holds one (cap_part_pct, else None)."""
    held, cap_parts = held or {}, cap_parts or {}
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
                **share(s),
                "compute_achieved_pct": achieved.get((s.gpu_uuid, s.guest)),
                **dict(zip(HELD_KEYS, held.get((s.gpu_uuid, s.guest), (None,) * len(HELD_KEYS)), strict=True)),
                "cap_part_pct": cap_parts.get((s.gpu_uuid, s.guest)),
                "label": label_text(s.label),  # cleaned again: whatever vmgpud answered reaches a terminal
                "settings": s.settings,
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
                "oom_script": f.oom_script,
                "ctx_reserve_bytes": None if f.ctx_reserve_bytes < 0 else f.ctx_reserve_bytes,
                "peer_timeout_s": f.peer_timeout_s or None,
            }
            for f in reply.forwarders
        ],
        "settings": {
            "oom_scripts_dir": reply.settings.oom_scripts_dir,
            "oom_script": reply.settings.oom_script,
            "ctx_reserve_bytes": None if reply.settings.ctx_reserve_bytes < 0 else reply.settings.ctx_reserve_bytes,
            "peer_timeout_s": reply.settings.peer_timeout_s or None,
            "mps_dir": reply.settings.mps_dir or None,
            "mps_pid": reply.settings.mps_pid or None,
        },
    }


def top(reply, shares: dict[tuple[str, str], float | None], interval_s: float, held: dict | None = None) -> dict:
    """One frame of `vmgpu top`: the status (reply) with the compute each guest held over the
    last interval_s seconds (ComputeSampler.take) and, under shared, its hold (.held)."""
    return {**status(reply, shares, held), "interval_s": interval_s}


def breakdown(stats_file: str, interval: float = 0.0) -> dict:
    """A forwarder's statistics page: since it started, or what happens in the next interval s."""
    from vmgpu import stats

    a = stats.read(stats_file)
    if interval > 0:
        time.sleep(interval)
        return stats.delta(a, stats.read(stats_file))
    return {**a, "seconds": None}
