"""vmgpud's service: the one object that owns the admission ledger, the supervisor of the
forwarders and the GPUs' scheduler pages, and implements what vmgpud does — admit, release,
start and stop a forwarder, set a weight or a policy, report the status.

Every check of a request is here (the guest name's one rule, kind, backend, wait mode); a
refusal is a VmgpuError, which the gRPC layer (vmgpu/daemon.py) turns into its status through
the code table of vmgpu/errors.py.  Calls that touch the ledger or the supervisor hold one lock
(the supervisor's restart threads take it too)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from vmgpu import config, errors, files, gpu, names, sched
from vmgpu.ledger import GpuUsage, Ledger, Reservation
from vmgpu.logging import get_logger
from vmgpu.metrics import Metrics
from vmgpu.spec import PRIORITIES, parse
from vmgpu.supervisor import HostSettings, Supervisor


@dataclass
class ForwarderStatus:
    """A guest's recorded forwarder as `vmgpu status` shows it."""

    guest: str
    pid: int
    region: str
    backend: str
    state: str  # running | restarting | stopped
    restart_attempt: int = 0
    restart_error: str = ""
    mem_used_mib: list[int] = field(default_factory=list)  # per GPU, from its statistics page
    processes: int = 0
    sync_calls: int = 0
    async_calls: int = 0
    # the managed settings it was started with (recorded with it): "" / -1 / 0 the forwarder's default
    oom_script: str = ""
    ctx_reserve_bytes: int = -1
    peer_timeout_s: int = 0


@dataclass
class Status:
    gpus: list[GpuUsage]
    slices: list[Reservation]
    forwarders: list[ForwarderStatus]
    settings: HostSettings = field(default_factory=HostSettings)
    mps_pid: int = 0  # vmgpud --mps: its MPS control daemon's pid now (0: none, or not running)


def _one_of(what: str, value: str, allowed: tuple[str, ...], words: str) -> str:
    if value not in allowed:
        raise errors.InvalidArgument(f"{what} '{value}' is {words}")
    return value


class Service:
    def __init__(self, ledger: Ledger, supervisor: Supervisor, lock: threading.Lock, metrics: Metrics):
        self.ledger = ledger
        self.supervisor = supervisor
        self.lock = lock
        self.metrics = metrics

    @classmethod
    def open(cls, ledger: Ledger, inventory, state_dir: Path, settings: HostSettings | None = None) -> Service:
        """The service of a starting vmgpud: the host's forwarder settings checked, the ledger's
        GPUs synced with the inventory, its MPS control daemon running (--mps), the forwarders
        still running adopted (the dead ones restarted, with the settings of now), their watch and
        the share controller started."""
        settings = (settings or HostSettings()).check()
        ledger.sync_gpus(gpu.inventory(inventory))
        lock = threading.Lock()
        supervisor = Supervisor(ledger, lock, state_dir, settings=settings)
        if supervisor.mps:
            supervisor.mps.ensure()  # (vmgpud does not start with an MPS daemon it was told to run and cannot)
        with lock:
            supervisor.adopt()
        supervisor.watch()
        supervisor.control_shares()
        return cls(ledger, supervisor, lock, Metrics(ledger, lock, supervisor))

    def close(self) -> None:
        """vmgpud stops; the forwarders keep serving (adopted next time)."""
        self.supervisor.close()

    def admit(self, guest: str, kind: str, spec_text: str, label: str = "") -> list[Reservation]:
        """Reserve the share spec_text for guest, all slices or none (counted in the metrics).
        Its settings are checked first (an OOM script must be one the host can run safely);
        label: what the operator knows the guest by (untrusted: cleaned, config.label_text)."""
        _one_of("kind", kind, config.KINDS, f"not one of {', '.join(config.KINDS)}")
        names.check_guest(guest)
        try:
            share = parse(spec_text)
            self.supervisor.settings.check_guest(share.settings)  # an OOM script it could not run: refused
            for s in share.slices:
                self.supervisor.settings.check_priority(s.priority, guest)  # above the host's ceiling: refused
            with self.lock:
                slices = self.ledger.admit(guest, kind, share, config.label_text(label))
        except errors.VmgpuError as e:
            self.metrics.admissions.labels(result=e.code.lower()).inc()
            raise
        self.metrics.admissions.labels(result="admitted").inc()
        return slices

    def release(self, guest: str) -> bool:
        """Stop guest's forwarder, free its share and remove its recorded region file (only
        if it is vmgpu's own: files.remove_ours); False: it held nothing."""
        names.check_guest(guest)
        with self.lock:
            recorded = self.ledger.forwarder(guest)
            self.supervisor.stop(guest)
            held = self.ledger.release(guest)
        if recorded:
            self._remove_region(guest, recorded[1])
        return held

    def _remove_region(self, guest: str, region: str) -> None:
        log = get_logger(guest=guest, region=region)
        try:
            if files.remove_ours(region):
                log.info("region removed")
        except (errors.UnsafePath, OSError) as e:  # the guest is released all the same
            log.warning("region left in place", reason=str(e))

    def start(self, guest: str, region: str, backend: str = "", size: str = "", wait: str = "") -> int:
        """Start guest's forwarder on region (size: create it first); its pid."""
        names.check_guest(guest)
        backend = _one_of("backend", backend or "cuda", config.BACKENDS, "neither cuda nor sim")
        wait = _one_of("wait", wait or "futex", config.WAITS, "neither futex nor poll")
        with self.lock:
            return self.supervisor.start(guest, region, backend, size, wait)

    def stop(self, guest: str) -> bool:
        """Stop guest's forwarder (it stays admitted); False: it had none."""
        names.check_guest(guest)
        with self.lock:
            return self.supervisor.stop(guest)

    def weight(self, guest: str, gpu_ref: str, weight: int) -> tuple[str, bool]:
        """Set guest's compute weight on a GPU: (the GPU's UUID, whether its page took it now)."""
        names.check_guest(guest)
        with self.lock:
            uuid = self.ledger.set_weight(guest, gpu_ref, weight)
        return uuid, sched.apply(uuid, weights={guest: weight})

    def cap(self, guest: str, gpu_ref: str, cap: int) -> tuple[str, bool]:
        """Set guest's cap (% of its throughput alone, 0: none) on a GPU: (its UUID, whether its page took it now)."""
        names.check_guest(guest)
        with self.lock:
            uuid = self.ledger.set_cap(guest, gpu_ref, cap)
        return uuid, sched.apply(uuid, caps={guest: cap})

    def priority(self, guest: str, gpu_ref: str, priority: str) -> tuple[str, bool]:
        """Set guest's priority (high, normal, low) on a GPU: (its UUID, whether its page took it now)."""
        names.check_guest(guest)
        if priority in PRIORITIES:  # (a value that is none of them is the ledger's to refuse)
            self.supervisor.settings.check_priority(priority, guest)
        with self.lock:
            uuid = self.ledger.set_priority(guest, gpu_ref, priority)
        return uuid, sched.apply(uuid, priorities={guest: priority})

    def policy(self, gpu_ref: str, policy: str) -> tuple[str, bool]:
        """Set a GPU's compute policy: (its UUID, whether its page took it now)."""
        with self.lock:
            uuid = self.ledger.set_policy(gpu_ref, policy)
        return uuid, sched.apply(uuid, policy=policy)

    def status(self) -> Status:
        with self.lock:
            usage, slices, fwds = self.ledger.usage(), self.ledger.reservations(), self.ledger.forwarders()
            managed = {g: self.ledger.forwarder_settings(g) for g, *_ in fwds}
        return Status(
            usage,
            slices,
            [self._forwarder(g, pid, region, b, managed[g]) for g, pid, region, b, _ in fwds],
            self.supervisor.settings,
            (self.supervisor.mps.pid() or 0) if self.supervisor.mps else 0,
        )

    def _forwarder(self, guest: str, pid: int, region: str, backend: str, managed: dict) -> ForwarderStatus:
        state, attempt, why = self.supervisor.state(guest, pid, region)
        f = ForwarderStatus(guest, pid, region, backend, state, attempt, why)
        ctx = managed.get("ctx_reserve")
        f.oom_script, f.peer_timeout_s = managed.get("oom_script", ""), managed.get("peer_timeout_s", 0)
        f.ctx_reserve_bytes = -1 if ctx is None else ctx
        st = self.supervisor.stats(guest) if state == "running" else None
        if st:
            f.mem_used_mib = [m["used"] >> 20 for m in st["memory"]]
            f.processes, f.sync_calls, f.async_calls = st["processes"], st["sync_calls"], st["async_calls"]
        return f
