"""A pool host's data plane (`vmgpu pool join --serve DIR`): guests on other machines reach this
host's GPUs through vmgpu-netbridge.

DIR (root's, no one else may write it) holds the bridge's key and certificate (made once; the
certificate's SHA-256 fingerprint goes into the host's pool record, and guests pin it) and
guests/, one entry per guest served here ("REGION TOKEN-SHA256", what `vmgpu-netbridge serve`
reads).  For each guest holding slices on this host the agent runs a forwarder on those GPUs,
with the slices' memory as its quota, on a region of its own in /dev/shm; when the guest is
released (or its slices expire), its entry goes first, then its forwarder and region.  One
`vmgpu-netbridge serve` listens on the host's data-plane address and port for every guest."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from vmgpu import files, names
from vmgpu.errors import ForwarderError, VmgpuError
from vmgpu.forwarder import Forwarder, native_dir
from vmgpu.logging import get_logger
from vmgpu.pool.records import GpuRecord, GuestRecord, RecordError, SliceRecord, load_all
from vmgpu.pool.store import GPUS, GUESTS, SLICES, Store

REGION_SIZE = "256M"
_PR_SET_PDEATHSIG = 1


def netbridge() -> Path:
    exe = native_dir() / "vmgpu-netbridge"
    if not exe.exists():
        raise VmgpuError(
            f"{exe} is not built: the network data plane needs OpenSSL's headers when vmgpu is built "
            "(apt-get install libssl-dev pkg-config, then make native or reinstall the wheel)"
        )
    return exe


def _die_with_parent() -> None:
    """In a child: end when the agent ends, however it ends (no forwarder serves on unsupervised)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def fingerprint_of(cert_dir: Path) -> str:
    """The SHA-256 fingerprint of cert_dir/cert.pem (made with its key first if there is none)."""
    import hashlib
    import ssl

    pem = cert_dir / "cert.pem"
    if not pem.exists():
        subprocess.run([str(netbridge()), "cert", str(cert_dir)], check=True, capture_output=True)
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.read_text())).hexdigest()


@dataclass
class Served:
    guest: str
    token_sha256: str
    gpus: tuple[int, ...]
    mem_mib: int
    shares: tuple[tuple[str, int], ...]  # per GPU, in the order of gpus: (its UUID, the compute % reserved)
    forwarder: Forwarder


@dataclass
class DataPlane:
    host: str
    state_dir: Path
    listen: str  # ADDRESS:PORT
    backend: str = "cuda"
    served: dict[str, Served] = field(default_factory=dict)
    bridge: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.log = get_logger(host=self.host)
        self.state_dir = files.private_dir(self.state_dir)
        self.cert_dir = files.private_dir(self.state_dir / "cert")
        self.guests_dir = files.private_dir(self.state_dir / "guests")

    def start(self) -> str:
        """The bridge listening; the certificate's fingerprint (for the host's pool record)."""
        fp = fingerprint_of(self.cert_dir)
        for stale in self.guests_dir.iterdir():  # a previous agent's guests: their forwarders ended with it
            stale.unlink()
        self._start_bridge()
        self.log.info("pool data plane listening", listen=self.listen, fingerprint=fp)
        return fp

    def _start_bridge(self) -> None:
        log = open(self.state_dir / "netbridge.log", "ab")
        self.bridge = subprocess.Popen(
            [str(netbridge()), "serve", "--listen", self.listen, "--guests", str(self.guests_dir)]
            + ["--cert", str(self.cert_dir)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=_die_with_parent,
        )
        log.close()

    def region(self, guest: str) -> Path:
        return Path("/dev/shm") / f"vmgpu-pool-{self.host}-{guest}"

    def _wanted(self, store: Store) -> dict[str, tuple]:
        """guest -> (token hash, this host's GPU indices of its slices, memory per slice, and per
        slice in the same order its GPU's UUID and the compute % reserved for it)."""
        log = self.log
        guests = {g.guest: g for _, g in load_all(store.range(GUESTS)[0], GuestRecord.load, log)}
        gpus = {g.uuid: g for _, g in load_all(store.range(GPUS)[0], GpuRecord.load, log) if g.host == self.host}
        want: dict[str, list] = {}
        for _, s in load_all(store.range(SLICES)[0], SliceRecord.load, log):
            if s.host == self.host and s.uuid in gpus and s.guest in guests:
                want.setdefault(s.guest, []).append(s)
        out = {}
        for guest, slices in want.items():
            slices.sort(key=lambda s: gpus[s.uuid].index)
            idx = tuple(gpus[s.uuid].index for s in slices)
            shares = tuple((s.uuid, s.compute_pct) for s in slices)
            out[guest] = (guests[guest].token_sha256, idx, max(s.mem_mib for s in slices), shares)
        return out

    def reconcile(self, store: Store) -> None:
        """Serve exactly the guests that hold slices here now."""
        try:
            want = self._wanted(store)
        except (VmgpuError, RecordError) as e:
            self.log.warning("pool data plane not reconciled", reason=str(e))
            return
        for guest in list(self.served):
            w = want.get(guest)
            s = self.served[guest]
            alive = s.forwarder.proc is not None and s.forwarder.proc.poll() is None
            if w != (s.token_sha256, s.gpus, s.mem_mib, s.shares) or not alive:
                self._stop(guest, "released" if w is None else "changed" if alive else "its forwarder ended")
        if self.bridge is not None and self.bridge.poll() is not None:
            # the guests it served are still served: their entries and forwarders stay
            self.log.error("pool data plane bridge ended; starting it again", status=self.bridge.returncode)
            self._start_bridge()
        for guest, (sha, gpus, mem, shares) in want.items():
            if guest not in self.served:
                self._serve(guest, sha, gpus, mem, shares)

    def _serve(
        self, guest: str, sha: str, gpus: tuple[int, ...], mem_mib: int, shares: tuple[tuple[str, int], ...]
    ) -> None:
        names.check_guest(guest)
        # each GPU's compute scheduler, shared with every forwarder on it (the page named by the
        # GPU's UUID): the share the pool reserved is the guest's guarantee, and its weight for what
        # is left over (1 where none was reserved)
        pct = [c for _, c in shares]
        fwd = Forwarder(
            self.region(guest),
            backend=self.backend,
            gpus=",".join(map(str, gpus)),
            mem=f"{mem_mib}M",
            size=REGION_SIZE,
            guest=guest,
            extra=(
                "--guarantee",
                ",".join(str(c) for c in pct),
                "--weight",
                ",".join(str(max(c, 1)) for c in pct),
                "--sched-id",
                ",".join(u for u, _ in shares),
            ),
            preexec_fn=_die_with_parent,
        )
        try:
            fwd.start()
        except ForwarderError as e:
            self.log.error("pool guest not served", guest=guest, reason=str(e))
            return
        entry = self.guests_dir / guest
        fd, tmp = files.create_beside(entry)
        os.write(fd, f"{self.region(guest)} {sha}\n".encode())
        os.close(fd)
        os.replace(tmp, entry)
        self.served[guest] = Served(guest, sha, gpus, mem_mib, shares, fwd)
        self.log.info("pool guest served", guest=guest, gpus=list(gpus), mem_mib=mem_mib, compute_pct=pct)

    def _stop(self, guest: str, why: str) -> None:
        s = self.served.pop(guest)
        (self.guests_dir / guest).unlink(missing_ok=True)  # no new link from here on
        s.forwarder.stop()
        self.region(guest).unlink(missing_ok=True)
        self.log.info("pool guest no longer served", guest=guest, reason=why)

    def stop(self) -> None:
        for guest in list(self.served):
            self._stop(guest, "the agent stopped")
        if self.bridge is not None and self.bridge.poll() is None:
            self.bridge.terminate()
            try:
                self.bridge.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.bridge.kill()
                self.bridge.wait()
