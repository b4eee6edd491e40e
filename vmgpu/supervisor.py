"""vmgpud's forwarders: one per admitted guest, started with the guest's own quota, recorded
in the ledger, re-adopted when vmgpud restarts, restarted if one dies, stopped on release.

A forwarder that dies is started again on the same region with the region's own geometry
(wait mode, channels, bulk size: recorded when it was first started, else read from the
region's header), by a restart loop that backs off (RESTART_POLICY) and never gives the
guest up: its record stays in the ledger until a forwarder runs again or it is stopped.  A
forwarder that dies again soon after a restart counts as a failed attempt, so a forwarder
that cannot live is not restarted in a storm.  Each forwarder started again is counted
(`restarted`, exported by vmgpu/metrics.py)."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tenacity

from vmgpu import config, sched, shm
from vmgpu.errors import Conflict, ForwarderError, NotFound, VmgpuError
from vmgpu.forwarder import Forwarder, is_forwarder
from vmgpu.ledger import Ledger
from vmgpu.logging import get_logger

_WAIT_NAMES = {v: k for k, v in shm.WAIT_MODES.items()}


def restart_policy(first_s: float = 0.5, max_s: float = 30.0, settle_s: float = 30.0) -> dict:
    """The named back-off for restarting a guest's forwarder: the first try at once, then
    waits of first_s, doubling up to max_s, forever (the guest is never given up).  A restarted
    forwarder must live settle_s to end the sequence; one that dies sooner is a failed try."""
    return dict(
        wait=tenacity.wait_exponential(multiplier=first_s, max=max_s),
        retry=tenacity.retry_if_exception_type(Exception),
        reraise=True,
        settle_s=settle_s,
    )


RESTART_POLICY = restart_policy()


def region_geometry(region: str | Path) -> dict:
    """The geometry a forwarder must be given to serve region as it is, from its header
    (untrusted: checked against what the forwarder can be told, its magic and version)."""
    try:
        r = shm.Region.open(region)
    except VmgpuError as e:
        raise ForwarderError(f"cannot read the geometry of region {region}: {e.message}") from None
    try:
        h = r.header()
    finally:
        r.close()
    if h["magic"] != shm.MAGIC:
        raise ForwarderError(f"region {region} has no vmgpu header (magic {h['magic']:016x}): recreate it")
    d = shm.Params()
    if h["wait_mode"] not in _WAIT_NAMES:
        raise ForwarderError(f"region {region} has an unknown wait mode {h['wait_mode']}: recreate it")
    if (h["req_ring_size"], h["cpl_ring_size"], h["heap_block_size"]) != (
        d.req_ring_size,
        d.cpl_ring_size,
        d.heap_block_size,
    ):
        raise ForwarderError(f"region {region} has ring or heap-block sizes vmgpu-forwarder cannot serve: recreate it")
    return {"wait": _WAIT_NAMES[h["wait_mode"]], "channels": h["nchannels"], "bulk": h["bulk_size"]}


def _geometry_args(g: dict) -> tuple[str, ...]:
    return ("--wait", str(g["wait"]), "--channels", str(int(g["channels"])), "--bulk", str(int(g["bulk"])))


@dataclass
class Restart:
    """A guest's forwarder being restarted: the loop's attempt and why the last one failed."""

    attempt: int = 0
    error: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)


class Supervisor:
    def __init__(self, ledger: Ledger, lock: threading.Lock, state_dir: str | Path, policy: dict | None = None):
        self.ledger = ledger
        self.lock = lock
        self.logs = Path(state_dir) / "forwarders"
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.children: dict[str, Forwarder] = {}  # the ones this vmgpud started (to reap them)
        self.restarts: dict[str, Restart] = {}  # guests whose forwarder is being restarted
        # forwarders started again after one died, per guest, since this vmgpud started (under
        # self.lock): vmgpu_forwarder_restarts_total
        self.restarted: collections.Counter[str] = collections.Counter()
        self.policy = dict(policy or RESTART_POLICY)
        self.log = get_logger(component="supervisor")
        self._stop = threading.Event()

    def start(self, guest: str, region: str, backend: str, size: str, wait: str = "futex") -> int:
        """Start guest's forwarder on its reserved GPUs, each with its reserved memory as quota.
        size: create the region with that size and wait mode; empty: serve the region as it is
        (its geometry as recorded for guest, else from its header)."""
        slices = self.ledger.reservations(guest)
        if not slices:
            raise NotFound(f"guest {guest} is not admitted")
        held = self.ledger.forwarder(guest)
        if held and is_forwarder(held[0], held[1]):
            raise Conflict(f"guest {guest} already has a forwarder (pid {held[0]}) on {held[1]}")
        if size:
            geometry = config.region_geometry(wait)
        else:
            recorded = self.ledger.forwarder_geometry(guest)
            geometry = recorded if recorded and held and held[1] == region else region_geometry(region)
        fwd = Forwarder(
            Path(region),
            backend=backend,
            gpus=",".join(str(s.gpu_index) for s in slices),
            mem=",".join(f"{s.mem_mib}M" for s in slices),
            size=size or None,
            guest=guest,
            log_path=self.logs / f"{guest}.log",
            extra=(
                "--stats", str(self.stats_path(guest)), *_geometry_args(geometry),
                "--compute", ",".join(str(s.weight) for s in slices),
                "--sched-id", ",".join(s.gpu_uuid for s in slices),
            ),
        ).start()  # fmt: skip
        policies = self.ledger.policies()
        for s in slices:  # the forwarder has joined each GPU's scheduler: give the page its policy
            sched.apply(s.gpu_uuid, policy=policies.get(s.gpu_uuid, "weighted"))
        self.children[guest] = fwd
        self.ledger.record_forwarder(guest, fwd.proc.pid, region, backend, size, geometry)
        self.log.info("forwarder started", guest=guest, pid=fwd.proc.pid, region=region, backend=backend)
        return fwd.proc.pid

    def stats_path(self, guest: str) -> Path:
        return self.logs / f"{guest}.stats"

    def stats(self, guest: str) -> dict | None:
        """The guest's forwarder statistics page, or None if there is none to read."""
        from vmgpu import stats

        try:
            return stats.read(self.stats_path(guest))
        except Exception:  # noqa: BLE001 - a forwarder being (re)started has no page yet
            return None

    def state(self, guest: str, pid: int, region: str) -> tuple[str, int, str]:
        """(running | restarting | stopped, restart attempt, last restart error) of guest's
        recorded forwarder."""
        r = self.restarts.get(guest)
        child = self.children.get(guest)
        alive = child.proc.poll() is None if child is not None else is_forwarder(pid, region)
        if alive:
            return "running", r.attempt if r else 0, ""
        if r is not None:
            return "restarting", r.attempt, r.error
        return "stopped", 0, ""

    def stop(self, guest: str) -> bool:
        r = self.restarts.pop(guest, None)
        if r is not None:
            r.cancel.set()
        held = self.ledger.forwarder(guest)
        if not held:
            return False
        pid, region = held[0], held[1]
        child = self.children.pop(guest, None)
        if child is not None:
            child.stop()
        elif is_forwarder(pid, region):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while is_forwarder(pid, region) and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_forwarder(pid, region):
                os.kill(pid, signal.SIGKILL)
        self.ledger.forget_forwarder(guest)
        self.log.info("forwarder stopped", guest=guest, pid=pid)
        return True

    def adopt(self) -> None:
        """At vmgpud start: keep the forwarders still running, restart the ones that died."""
        for guest, pid, region, backend, _size in self.ledger.forwarders():
            if is_forwarder(pid, region):
                self.log.info("forwarder adopted", guest=guest, pid=pid, region=region)
            else:
                self._restart(guest, pid, region, backend, "was not running when vmgpud started")

    def _restart(self, guest, pid, region, backend, why) -> None:
        """Begin restarting guest's forwarder (the caller holds self.lock).  Its record stays
        in the ledger until a new forwarder replaces it or the guest's forwarder is stopped."""
        if guest in self.restarts:
            return
        self.log.warning("forwarder restarting", guest=guest, old_pid=pid, reason=why)
        child = self.children.pop(guest, None)
        if child is not None:
            child.stop()  # reaps it and closes its log
        r = self.restarts[guest] = Restart()
        threading.Thread(
            target=self._restart_loop, args=(guest, region, backend, r), name=f"restart-{guest}", daemon=True
        ).start()

    def _restart_loop(self, guest, region, backend, r: Restart) -> None:
        policy = {k: v for k, v in self.policy.items() if k != "settle_s"}
        settle_s = self.policy.get("settle_s", 30.0)
        stopped = tenacity.stop_any(tenacity.stop_when_event_set(r.cancel), tenacity.stop_when_event_set(self._stop))

        def sleep(seconds):
            r.cancel.wait(seconds)

        def attempt():
            with self.lock:
                if r.cancel.is_set() or self._stop.is_set() or self.restarts.get(guest) is not r:
                    return None
                r.attempt += 1
                try:
                    held = self.ledger.forwarder(guest)
                    if not held:
                        return None  # stopped meanwhile
                    pid = self.start(guest, region, backend, "")
                    self.restarted[guest] += 1
                except Exception as e:
                    r.error = getattr(e, "message", None) or str(e)
                    self.log.error("forwarder restart failed", guest=guest, attempt=r.attempt, error=r.error)
                    raise
            # it must live a while: one that dies at once is a failed attempt too
            child = self.children.get(guest)
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline and not r.cancel.is_set() and not self._stop.is_set():
                if child is None or child.proc.poll() is not None:
                    r.error = f"it exited again {settle_s - (deadline - time.monotonic()):.1f} s after its restart"
                    self.log.error("restarted forwarder died", guest=guest, attempt=r.attempt, pid=pid)
                    raise ForwarderError(r.error)
                r.cancel.wait(min(0.25, settle_s))
            return pid

        try:
            pid = tenacity.Retrying(stop=stopped, sleep=sleep, **policy)(attempt)
        except Exception:  # noqa: BLE001 - stopped (vmgpud closing, or the guest's forwarder stopped)
            return
        finally:
            with self.lock:
                if self.restarts.get(guest) is r:
                    del self.restarts[guest]
        if pid:
            self.log.info("forwarder restarted", guest=guest, pid=pid, attempts=r.attempt)

    def watch(self, interval: float = 1.0) -> None:
        """Restart forwarders that die (a thread, until close())."""

        def loop():
            while not self._stop.wait(interval):
                with self.lock:
                    if self._stop.is_set():
                        return
                    try:
                        for guest, pid, region, backend, _size in self.ledger.forwarders():
                            if guest in self.restarts:
                                continue  # its restart loop watches it
                            child = self.children.get(guest)
                            dead = child.proc.poll() is not None if child else not is_forwarder(pid, region)
                            if dead:
                                self._restart(guest, pid, region, backend, "it exited")
                    except Exception as e:  # noqa: BLE001 - the watch goes on
                        self.log.error("forwarder check failed", error=str(e))

        threading.Thread(target=loop, name="forwarder-watch", daemon=True).start()

    def close(self) -> None:
        """vmgpud stops; the forwarders keep serving their guests and are adopted next time."""
        with self.lock:
            self._stop.set()
            for r in self.restarts.values():
                r.cancel.set()
