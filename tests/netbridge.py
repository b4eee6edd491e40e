"""Test helpers for vmgpu-netbridge: a GPU host's half (a forwarder and `serve` beside it) and a
guest machine's half (`attach`, making the region the guest maps), on loopback or in network
namespaces (tests/pool), and a raw TLS peer that speaks the bridge's frames itself (the hostile
tests)."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path

from tests.forwarder import ASAN, NATIVE

NETBRIDGE = NATIVE / "vmgpu-netbridge"
NETBRIDGE_ASAN = ASAN / "vmgpu-netbridge"  # make native-asan: the hostile tests' serve
FRAME = struct.Struct("<IIQ")
F_HELLO, F_WELCOME, F_REFUSED, F_REC, F_BULK, F_RELEASE = 1, 2, 3, 4, 5, 6
REC_BULK_NOTE = 0xFF01
NOTE = struct.Struct("<QQII")
TO_HOST, FROM_HOST = 1, 2


def secrets_in(d: Path) -> tuple[str, Path, str]:
    """A certificate for serve in d (its fingerprint), and a guest token in d/token (its SHA-256)."""
    d.chmod(0o700)
    fp = subprocess.run([str(NETBRIDGE), "cert", str(d)], capture_output=True, text=True, check=True).stdout.strip()
    token = d / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    value = secrets.token_hex(32)
    os.write(fd, (value + "\n").encode())
    os.close(fd)
    return fp, token, hashlib.sha256(value.encode()).hexdigest()


def _wait_line(p: subprocess.Popen, want: str, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{want!r} never came: exit {p.returncode}\n{log.read_text()}")
        if want in log.read_text():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{want!r} not within {timeout} s\n{log.read_text()}")


def serve_guest(guests: Path, guest: str, region: Path, token_sha256: str) -> None:
    """What `vmgpu pool join` writes for a guest it serves: DIR/GUEST = "REGION SHA256"."""
    guests.mkdir(mode=0o700, exist_ok=True)
    (guests / guest).write_text(f"{region} {token_sha256}\n")
    (guests / guest).chmod(0o600)


def serve(guests: Path, listen: str, cert_dir: Path, log: Path, preexec=None, asan=False) -> subprocess.Popen:
    """serve (asan: the ASan/UBSan build, whose log must stay free of reports: sanitizer_reports)."""
    exe = NETBRIDGE_ASAN if asan else NETBRIDGE
    if asan and not exe.exists():
        raise RuntimeError(f"{exe} is missing: run `make native-asan`")
    out = open(log, "ab")
    p = subprocess.Popen(
        [str(exe), "serve", "--listen", listen, "--guests", str(guests), "--cert", str(cert_dir)],
        stdout=subprocess.DEVNULL,
        stderr=out,
        preexec_fn=preexec,
        start_new_session=True,  # its children with it (stop())
    )
    out.close()
    _wait_line(p, "listening on", log)
    return p


def attach(
    region: Path,
    connect: str,
    guest: str,
    fingerprint: str,
    token: Path,
    log: Path,
    size: str = "128M",
    preexec=None,
    wait=True,
) -> subprocess.Popen:
    out = open(log, "ab")
    argv = [str(NETBRIDGE), "attach", "--connect", connect, "--guest", guest, "--region", str(region)]
    argv += ["--size", size, "--fingerprint", fingerprint, "--token-file", str(token)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, preexec_fn=preexec)
    out.close()
    if wait:
        _wait_line(p, "the GPU is at", log)
    return p


def sanitizer_reports(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if "Sanitizer" in ln or "runtime error" in ln]


def stop(p: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    """Stop a bridge process (serve: with the children serving its links)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig) if sig == signal.SIGKILL else p.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        return p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


class RawPeer:
    """A guest's side of one link written by hand: TLS (the certificate not checked), the hello
    with a token, then whatever frames a test sends."""

    def __init__(self, addr: tuple[str, int], guest: str, token: str, purpose: str = "channel"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        raw = socket.create_connection(addr, timeout=10)
        self.s = ctx.wrap_socket(raw)
        self.send(F_HELLO, 0, f"vmgpu-net 1 {purpose} {guest} {token}".encode())
        self.kind, self.aux, self.payload = self.recv()

    def send(self, kind: int, aux: int, payload: bytes = b"", length: int | None = None) -> None:
        self.s.sendall(FRAME.pack(kind, len(payload) if length is None else length, aux) + payload)

    def recv(self) -> tuple[int, int, bytes]:
        head = self._exact(FRAME.size)
        kind, n, aux = FRAME.unpack(head)
        return kind, aux, self._exact(n)

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True when the other side closed the link (what it sent before is read and dropped)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(65536):
                    return True
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError, OSError):
            return True

    def close(self) -> None:
        try:
            self.s.close()
        except OSError:
            pass
