"""vmgpud's forwarders: one per admitted guest, started with the guest's own quota, recorded
in the ledger, re-adopted when vmgpud restarts, restarted if one dies, stopped on release."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from vmgpu import sched
from vmgpu.errors import Conflict, NotFound
from vmgpu.forwarder import Forwarder, is_forwarder
from vmgpu.ledger import Ledger
from vmgpu.logging import get_logger


class Supervisor:
    def __init__(self, ledger: Ledger, lock: threading.Lock, state_dir: str | Path):
        self.ledger = ledger
        self.lock = lock
        self.logs = Path(state_dir) / "forwarders"
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.children: dict[str, Forwarder] = {}  # the ones this vmgpud started (to reap them)
        self.log = get_logger(component="supervisor")
        self._stop = threading.Event()

    def start(self, guest: str, region: str, backend: str, size: str, wait: str = "futex") -> int:
        """Start guest's forwarder on its reserved GPUs, each with its reserved memory as quota."""
        slices = self.ledger.reservations(guest)
        if not slices:
            raise NotFound(f"guest {guest} is not admitted")
        held = self.ledger.forwarder(guest)
        if held and is_forwarder(held[0], held[1]):
            raise Conflict(f"guest {guest} already has a forwarder (pid {held[0]}) on {held[1]}")
        fwd = Forwarder(
            Path(region),
            backend=backend,
            gpus=",".join(str(s.gpu_index) for s in slices),
            mem=",".join(f"{s.mem_mib}M" for s in slices),
            size=size or None,
            guest=guest,
            log_path=self.logs / f"{guest}.log",
            extra=(
                "--stats", str(self.stats_path(guest)), "--wait", wait,
                "--compute", ",".join(str(s.weight) for s in slices),
                "--sched-id", ",".join(s.gpu_uuid for s in slices),
            ),
        ).start()  # fmt: skip
        policies = self.ledger.policies()
        for s in slices:  # the forwarder has joined each GPU's scheduler: give the page its policy
            sched.apply(s.gpu_uuid, policy=policies.get(s.gpu_uuid, "weighted"))
        self.children[guest] = fwd
        self.ledger.record_forwarder(guest, fwd.proc.pid, region, backend, size)
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

    def stop(self, guest: str) -> bool:
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

    def _restart(self, guest, pid, region, backend, why):
        self.log.warning("forwarder restarted", guest=guest, old_pid=pid, reason=why)
        self.ledger.forget_forwarder(guest)
        self.children.pop(guest, None)
        try:
            # the region exists (guests may have it mapped): serve it as it is
            self.start(guest, region, backend, "")
        except Exception as e:  # noqa: BLE001 - reported, and tried again on the next check
            self.log.error("forwarder restart failed", guest=guest, error=str(e))

    def watch(self, interval: float = 1.0) -> None:
        """Restart forwarders that die (a thread, until close())."""

        def loop():
            while not self._stop.wait(interval):
                with self.lock:
                    if self._stop.is_set():
                        return
                    try:
                        for guest, pid, region, backend, _size in self.ledger.forwarders():
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
