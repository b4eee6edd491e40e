"""vmgpud's forwarders: one per admitted guest, started with the guest's own quota, recorded
in the ledger, re-adopted when vmgpud restarts, restarted if one dies, stopped on release.

A forwarder that dies is started again on the same region with the region's own geometry
(wait mode, channels, bulk size: recorded when it was first started, else read from the
region's header), by a restart loop that backs off (RESTART_POLICY) and never gives the
guest up: its record stays in the ledger until a forwarder runs again or it is stopped.  A
forwarder that dies again soon after a restart counts as a failed attempt, so a forwarder
that cannot live is not restarted in a storm.  Each forwarder started again is counted
(`restarted`, exported by vmgpu/metrics.py).

Every forwarder is started with the managed settings (HostSettings: the host's, `vmgpu daemon`
options, with the guest's own from its share spec over them): the OOM script, the context
reserve, the peer timeout.  An OOM script runs as root, so it is only ever a name, resolved in
the host's OOM-script directory and refused unless that directory, every directory above it
and the script are real (no link), root's (or vmgpud's user's) and writable by no one else:
checked at admission and again at every start (restarts included).  What a forwarder was
started with is recorded with it; `vmgpu status` shows it."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tenacity

from vmgpu import cap_control, config, files, mps, sched, share_control, shm, spec
from vmgpu.errors import Conflict, ForwarderError, InvalidArgument, NotFound, UnsafePath, VmgpuError
from vmgpu.forwarder import Forwarder, is_forwarder
from vmgpu.forwarder import sweep as forwarder_sweep
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
SHARE_ERROR_EVERY_S = 60.0  # a GPU's share control failing the same way again is logged this seldom


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


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _check_dir(path: Path, last: bool) -> None:
    """path, on the OOM-script directory's path, as files.check_trusted_dir says (above the
    scripts' own directory, a sticky one such as /tmp is allowed)."""
    try:
        files.check_trusted_dir(
            path,
            "on the OOM-script directory's path",
            "OOM scripts run as root, so their directory's path must be real directories, root's and writable by "
            "no one else (chown root, chmod go-w)",
            last,
        )
    except FileNotFoundError:
        raise NotFound(
            f"the OOM-script directory {path} does not exist: make it (root's, mode 0755) and put the scripts there"
        ) from None


def oom_script_path(directory: str | Path, name: str) -> Path:
    """The OOM script `name` in the host's OOM-script directory, checked: a name (never a path),
    a real executable file of root's (or vmgpud's user's) writable by no one else, in a directory
    that only root can change, down from /.  Raises SpecError, NotFound or UnsafePath."""
    name = spec.oom_script_name(name)
    d = Path(directory)
    if not d.is_absolute():
        raise InvalidArgument(f"the OOM-script directory {directory} is not an absolute path: give one")
    parts = d.parts
    for i in range(1, len(parts) + 1):
        _check_dir(Path(*parts[:i]), i == len(parts))
    path = d / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise NotFound(
            f"there is no OOM script {name} in {d}: put it there (root's, mode 0755), or name another"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(
            f"OOM script {path} is not a regular file (a link?): OOM scripts run as root; "
            "put the script itself there"
        )
    if not _trusted(st) or st.st_mode & 0o022:
        raise UnsafePath(
            f"OOM script {path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: it runs as "
            "root, so it must be root's and writable by no one else (chown root, chmod 0755)"
        )
    if not st.st_mode & 0o100:
        raise UnsafePath(f"OOM script {path} is not executable: chmod 0755 it")
    return path


def ctx_reserve(text: str) -> int:
    """A context reserve (a size) in bytes, within 0..config.CTX_RESERVE_MAX."""
    b = config.parse_size(text)
    if not 0 <= b <= config.CTX_RESERVE_MAX:
        raise InvalidArgument(
            f"ctx-reserve {text} is outside 0..{config.CTX_RESERVE_MAX >> 30}G (an H100 context is about 544M)"
        )
    return b


@dataclass(frozen=True)
class HostSettings:
    """The host's forwarder settings (`vmgpu daemon` options); a guest's own (its share spec's
    settings) are taken over them.  Unset: ctx_reserve None, peer_timeout_s 0, oom_script ""
    (the forwarder's defaults: 544M on a GPU, 5 s, no script)."""

    oom_scripts_dir: str = config.OOM_SCRIPTS_DIR
    oom_script: str = ""
    ctx_reserve: int | None = None  # bytes
    peer_timeout_s: int = 0
    # the highest compute priority a guest may hold on this host: its share spec comes from the
    # tenant (a container's VMGPU=, ALIYUN_COM_GPU_HIGH_PRIO, a domain's metadata), so the host
    # bounds what a tenant can ask for itself
    max_priority: str = "high"
    # vmgpud's MPS control daemon's directory (vmgpu/mps.py), "" for none: the guests' processes of a
    # GPU that is shared as they start become its clients and run side by side on spans of its SMs
    mps_dir: str = ""

    def check(self) -> HostSettings:
        """Refuse settings out of range, or an OOM script that cannot be run safely."""
        if self.max_priority not in spec.PRIORITIES:
            raise InvalidArgument(f"max-priority '{self.max_priority}' is not one of {', '.join(spec.PRIORITIES)}")
        if self.ctx_reserve is not None and not 0 <= self.ctx_reserve <= config.CTX_RESERVE_MAX:
            raise InvalidArgument(f"ctx-reserve {self.ctx_reserve} is outside 0..{config.CTX_RESERVE_MAX} bytes")
        if self.peer_timeout_s:
            spec.peer_timeout(str(self.peer_timeout_s))
        if self.mps_dir and not Path(self.mps_dir).is_absolute():
            raise InvalidArgument(f"mps {self.mps_dir!r} is not an absolute path (e.g. {config.MPS_DIR})")
        if self.oom_script:
            oom_script_path(self.oom_scripts_dir, self.oom_script)
        return self

    def check_priority(self, priority: str, guest: str) -> None:
        """A guest may hold a priority up to the host's ceiling (vmgpud --max-priority)."""
        order = spec.PRIORITIES  # high first
        if order.index(priority) < order.index(self.max_priority):
            raise InvalidArgument(
                f"guest {guest}: priority {priority} is above this host's ceiling {self.max_priority} "
                "(vmgpud --max-priority); ask for it no higher, or have the operator raise the ceiling"
            )

    def check_guest(self, guest: spec.Settings) -> None:
        """A guest's own settings at its admission: its OOM script must be one the host can run."""
        if guest.oom_script:
            oom_script_path(self.oom_scripts_dir, guest.oom_script)

    def effective(self, guest: spec.Settings) -> dict:
        """What a guest's forwarder is started with: its own settings, else the host's; the OOM
        script resolved and checked now (oom_script_path)."""
        name = guest.oom_script or self.oom_script
        return {
            "oom_script": name,
            "oom_script_path": str(oom_script_path(self.oom_scripts_dir, name)) if name else "",
            "ctx_reserve": self.ctx_reserve,
            "peer_timeout_s": guest.peer_timeout_s or self.peer_timeout_s,
        }


def settings_args(eff: dict) -> tuple[str, ...]:
    """effective() as the forwarder's options."""
    args: tuple[str, ...] = ()
    if eff.get("oom_script_path"):
        args += ("--oom-script", eff["oom_script_path"])
    if eff.get("ctx_reserve") is not None:
        args += ("--ctx-reserve", str(int(eff["ctx_reserve"])))
    if eff.get("peer_timeout_s"):
        args += ("--peer-timeout", str(int(eff["peer_timeout_s"])))
    return args


@dataclass
class Restart:
    """A guest's forwarder being restarted: the loop's attempt and why the last one failed."""

    attempt: int = 0
    error: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Controlled:
    """A GPU's page under vmgpud's controllers: its cap controller always, its share controller
    while its policy is shared."""

    page: sched.Page
    caps: cap_control.CapController
    shares: share_control.ShareController | None = None


class Supervisor:
    def __init__(
        self,
        ledger: Ledger,
        lock: threading.Lock,
        state_dir: str | Path,
        policy: dict | None = None,
        settings: HostSettings | None = None,
    ):
        self.ledger = ledger
        self.settings = settings or HostSettings()
        self.lock = lock
        self.logs = Path(state_dir) / "forwarders"
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.children: dict[str, Forwarder] = {}  # the ones this vmgpud started (to reap them)
        self.restarts: dict[str, Restart] = {}  # guests whose forwarder is being restarted
        # what a stopped forwarder left, being removed (vmgpu-forwarder --sweep), per guest
        self.sweeps: dict[str, tuple[subprocess.Popen, int]] = {}  # (and its pidfd, or -1)
        # forwarders started again after one died, per guest, since this vmgpud started (under
        # self.lock): vmgpu_forwarder_restarts_total
        self.restarted: collections.Counter[str] = collections.Counter()
        # per GPU under the controllers (uuid), written by their thread alone: why its guests were
        # held by time as last logged, when, the changes since, and why they are now (held_by_time)
        self._by_time: dict[str, tuple] = {}
        self.policy = dict(policy or RESTART_POLICY)
        self.log = get_logger(component="supervisor")
        self._stop = threading.Event()
        self._control: threading.Thread | None = None  # the share and cap controllers' thread (control_shares)
        self.mps = mps.Mps(self.settings.mps_dir) if self.settings.mps_dir else None
        self._mps_error = ""  # (the last restart failure logged)

    def start(self, guest: str, region: str, backend: str, size: str, wait: str = "futex") -> int:
        """Start guest's forwarder on its reserved GPUs, each with its reserved memory as quota.
        size: create the region with that size and wait mode; empty: serve the region as it is
        (its geometry as recorded for guest, else from its header)."""
        slices = self.ledger.reservations(guest)
        if not slices:
            raise NotFound(f"guest {guest} is not admitted")
        self._end_sweep(guest)  # (the new forwarder sweeps as it starts, and makes the page afresh)
        held = self.ledger.forwarder(guest)
        if held and is_forwarder(held[0], held[1]):
            raise Conflict(f"guest {guest} already has a forwarder (pid {held[0]}) on {held[1]}")
        if size:
            geometry = config.region_geometry(wait)
        else:
            recorded = self.ledger.forwarder_geometry(guest)
            geometry = recorded if recorded and held and held[1] == region else region_geometry(region)
        managed = self.settings.effective(self.ledger.guest_settings(guest))  # the OOM script checked now
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
                "--weight", ",".join(str(s.weight) for s in slices),
                "--guarantee", ",".join(str(s.guarantee_pct) for s in slices),
                "--cap", ",".join(str(s.cap_pct) for s in slices),
                "--priority", ",".join(s.priority for s in slices),
                "--sched-id", ",".join(s.gpu_uuid for s in slices),
                *settings_args(managed),
                *(("--mps", str(self.mps.pipe), "--mps-when", "shared") if self.mps else ()),
            ),
        ).start()  # fmt: skip
        policies = self.ledger.policies()
        for s in slices:  # the forwarder has joined each GPU's scheduler: give the page its policy
            sched.apply(s.gpu_uuid, policy=policies.get(s.gpu_uuid, "weighted"))
        self.children[guest] = fwd
        self.ledger.record_forwarder(guest, fwd.proc.pid, region, backend, size, geometry, managed)
        self.log.info(
            "forwarder started", guest=guest, pid=fwd.proc.pid, region=region, backend=backend, settings=managed
        )
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
        self._sweep(guest, pid)
        return True

    def _sweep(self, guest: str, pid: int) -> None:
        """Remove what guest's forwarder pid, stopped, may have left in /dev/shm that no forwarder
        starting would remove (one killed, or whose workers were: its module image cache, the
        driver's files of its workers), in the background, once it is gone: it and its workers
        may still be ending.  The caller holds self.lock."""
        self._end_sweep(guest)
        try:
            proc = forwarder_sweep(guest, pid, self.stats_path(guest), self.logs / f"{guest}.log")
        except (OSError, VmgpuError) as e:
            self.log.error("cannot sweep after the forwarder", guest=guest, error=str(e))
            return
        try:  # (signalled through its pidfd: never another process that got its pid once reaped)
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = -1
        self.sweeps[guest] = (proc, pidfd)

        def reap():
            rc = proc.wait()
            with self.lock:
                mine = self.sweeps.get(guest, (None,))[0] is proc
                if mine:
                    del self.sweeps[guest]
                    if pidfd >= 0:
                        os.close(pidfd)
            if mine and rc:
                self.log.error("the sweep after the forwarder failed", guest=guest, exit_status=rc)

        threading.Thread(target=reap, name=f"sweep-{guest}", daemon=True).start()

    def _end_sweep(self, guest: str) -> None:
        """End guest's sweep, if one is under way: a forwarder starts for it, which sweeps as it
        starts and makes the statistics page afresh (the caller holds self.lock)."""
        proc, pidfd = self.sweeps.pop(guest, (None, -1))
        if proc is None:
            return
        try:
            if pidfd >= 0:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            elif proc.returncode is None:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            if pidfd >= 0:
                os.close(pidfd)

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
                self._watch_mps()  # (not under the lock: a start may take START_S)
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

    def _watch_mps(self) -> None:
        """Start the MPS control daemon again if it died (the guests' processes started from then
        on are its clients; what becomes of the running ones was not measured).  A failure is
        logged when it first comes and when it changes, and tried again at each look."""
        if self.mps is None or self.mps.pid():
            return
        if not self._mps_error:  # (once an outage, not at every look while it lasts)
            self.log.warning("mps control daemon restarting", reason="it was not running")
        try:
            self.mps.ensure()
            self._mps_error = ""
        except Exception as e:  # noqa: BLE001 - tried again at the next look
            error = getattr(e, "message", str(e))
            if error != self._mps_error:
                self.log.error("mps control daemon restart failed", error=error)
            self._mps_error = error

    def control_shares(self, every: float = share_control.PERIOD_STEP_S, look_every: float = 1.0) -> None:
        """Run each GPU's controllers (a thread, until close()): the share controller
        (vmgpu/share_control.py) of a GPU whose policy is shared, the cap controller
        (vmgpu/cap_control.py) of every GPU not native; a GPU that leaves shared has its holds
        lifted once, and one that turns native its caps' parts.  The ledger is read, and pages
        not open are opened, every look_every seconds."""

        def loop():
            ctls: dict[str, _Controlled] = {}
            caps: dict[str, cap_control.CapController] = {}  # per GPU, kept while its page is opened afresh
            policies, looked = {}, 0.0
            failing: dict[str, tuple[str, float, int]] = {}  # per GPU: its last error logged, when, repeats since
            try:
                # (a probe's guest sampled finely meanwhile: its rate alone read between its bursts)
                while not cap_control.wait(self._stop, every, [(c.page, c.caps) for c in ctls.values()]):
                    now = time.monotonic()
                    if now - looked >= look_every:  # the ledger and the pages seldom: they change rarely
                        with self.lock:
                            policies = self.ledger.policies()
                        looked = now
                        for uuid in [u for u, p in policies.items() if p != "native" and u not in ctls]:
                            try:
                                page = sched.Page(sched.page_path(uuid))
                            except sched.SchedError:
                                continue  # no forwarder has run on it yet
                            except Exception as e:  # noqa: BLE001 - the other GPUs go on
                                _failed(failing, uuid, str(e), now)
                                continue
                            ctls[uuid] = _Controlled(page, caps.setdefault(uuid, cap_control.CapController()))
                    for uuid, c in list(ctls.items()):
                        policy = policies.get(uuid, "native")
                        try:
                            if policy == "shared" and c.shares is None:
                                # on SM spans where the forwarders partition the GPU (on MPS), else by time
                                c.shares = share_control.ShareController(lever="sms")
                            if c.shares is not None:
                                share_control.apply_step(c.page, c.shares, now)  # (off shared: holds lifted)
                            _held_by_time(self._by_time, uuid, c.shares.by_time if c.shares else None, now)
                            cap_control.apply_step(c.page, c.caps, now)  # (native: caps' parts withdrawn)
                            if policy != "shared":
                                c.shares = None
                            done = policy == "native"
                            if done:  # (its page's policy may not say so yet)
                                _close(c)
                                caps.pop(uuid, None)  # (what it measured is stale when the GPU comes back)
                        except Exception as e:  # noqa: BLE001 - the other GPUs go on
                            # the page is opened afresh at the next look at the ledger: a page that
                            # keeps failing is tried once a second, not ten times
                            _failed(failing, uuid, str(e), now)
                            _close(c)
                            done = True
                        if done:
                            c.page.close()
                            del ctls[uuid]
                            _left(self._by_time, uuid)
            finally:
                for c in ctls.values():  # (vmgpud stops: caps are cap% of the time again at once)
                    _close(c)
                    c.page.close()
                self._by_time.clear()

        def _close(c: _Controlled) -> None:
            """Take the cap controller's parts back off a page it stops controlling (where the page
            still answers; a part left stands at most VMGPU_SCHED_CAPS_FRESH_MS)."""
            with contextlib.suppress(Exception):
                cap_control.withdraw(c.page)

        def _left(logged: dict, uuid: str) -> None:
            """A GPU no longer controlled (it left shared and then turned native, or its page
            failed): where its last line said its guests were held by time, a line that they are
            no longer, at once; and its state forgotten, so that a later episode is logged anew."""
            last, _, changes, _ = logged.pop(uuid, (None, 0.0, 0, None))
            if last is not None:
                self.log.info(
                    "guests no longer held by time", gpu=uuid, why="the GPU left the share controller", changes=changes
                )

        def _held_by_time(logged: dict, uuid: str, why, now: float) -> None:
            """Log a GPU's guests going off SM spans, held by time, and why (share_control's
            by_time: a guest's work off its span, which the guest can bring about itself and
            which costs every guest on the GPU the overlap of spans; the forwarders not
            partitioning; more guests at work than groups), and coming back: a change at once,
            and then at most a line a minute, saying how things stand and how many times they
            changed since the last line (`changes`)."""
            last, at, changes, now_why = logged.get(uuid, (None, -math.inf, 0, None))
            if why != now_why:
                changes, now_why = changes + 1, why
            if now_why != last and now - at >= SHARE_ERROR_EVERY_S:
                if now_why is None:
                    self.log.info("guests no longer held by time", gpu=uuid, changes=changes)
                else:
                    guests = list(now_why[1])
                    self.log.warning(
                        "guests held by time, not on SM spans", gpu=uuid, why=now_why[0], guests=guests, changes=changes
                    )
                last, at, changes = now_why, now, 0
            logged[uuid] = (last, at, changes, now_why)

        def _failed(failing: dict, uuid: str, error: str, now: float) -> None:
            """Log a GPU's share or cap control failure: a new error at once, the same one again
            at most once a minute, with how often it came in between."""
            last, at, repeats = failing.get(uuid, ("", -math.inf, 0))
            if error != last or now - at >= SHARE_ERROR_EVERY_S:
                self.log.error("share or cap control failed", gpu=uuid, error=error, repeats=repeats)
                failing[uuid] = (error, now, 0)
            else:
                failing[uuid] = (last, at, repeats + 1)

        self._control = threading.Thread(target=loop, name="share-control", daemon=True)
        self._control.start()

    @property
    def held_by_time(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Each shared GPU (uuid) whose guests its share controller holds by time, not on SM spans,
        as at its last look: why, and the guests that make it so (share_control's by_time; for the
        metrics, read from another thread: a copy of the control thread's state)."""
        return {uuid: st[3] for uuid, st in dict(self._by_time).items() if st[3]}

    def close(self) -> None:
        """vmgpud stops; the forwarders keep serving their guests and are adopted next time (the
        cap controller's parts taken back first: their caps are cap% of the time until it looks
        again)."""
        with self.lock:
            self._stop.set()
            for r in self.restarts.values():
                r.cancel.set()
        if self._control is not None:  # (outside the lock: its loop takes it to read the ledger)
            self._control.join(timeout=5)
