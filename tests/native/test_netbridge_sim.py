"""vmgpu-netbridge on loopback, on the simulated backend: a guest whose region is made by
`attach` runs unchanged driver-API programs through `serve` and the forwarder beside it, and
every peer that is not the guest's, or that breaks the protocol, is refused without harm to the
forwarder or the next guest process.  (tests/pool runs the same across network namespaces.)"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests import netbridge as nb
from tests.forwarder import NATIVE, PTX, forwarder, guest_env, log_text, run_guest

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not nb.NETBRIDGE.exists(), reason="vmgpu-netbridge not built: needs libssl-dev (make native)"),
]


GUEST = "remote-guest"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bridge:
    """serve is the ASan/UBSan build: every test's hostile or honest peer runs against it."""

    def __init__(self, tmp: Path, fwd_region: Path):
        self.tmp = tmp
        self.fingerprint, self.token_file, self.token_sha = nb.secrets_in(tmp)
        self.token = self.token_file.read_text().strip()
        self.port = _port()
        self.addr = ("127.0.0.1", self.port)
        self.fwd_region = fwd_region
        self.region = Path("/dev/shm") / f"{fwd_region.name}-remote"
        self.serve_log = tmp / "serve.log"
        self.attach_log = tmp / "attach.log"
        self.guests = tmp / "guests"
        nb.serve_guest(self.guests, GUEST, fwd_region, self.token_sha)
        self.serve = nb.serve(self.guests, f"127.0.0.1:{self.port}", tmp, self.serve_log, asan=True)
        self.attach = None

    def start_attach(self, **kw) -> subprocess.Popen:
        self.attach = nb.attach(
            self.region, f"127.0.0.1:{self.port}", GUEST, self.fingerprint, self.token_file, self.attach_log, **kw
        )
        return self.attach

    def try_attach(self, fingerprint: str, token: Path) -> subprocess.Popen:
        return nb.attach(self.region, f"127.0.0.1:{self.port}", GUEST, fingerprint, token, self.attach_log, wait=False)

    def close(self) -> None:
        if self.attach:
            nb.stop(self.attach)
        nb.stop(self.serve)
        self.region.unlink(missing_ok=True)


@pytest.fixture
def bridge(shm_path, tmp_path):
    with forwarder(shm_path, backend="sim", mem="256M") as fwd:
        b = Bridge(tmp_path, shm_path)
        b.fwd = fwd
        try:
            yield b
        finally:
            b.close()
    assert not b.region.exists()
    assert nb.sanitizer_reports(b.serve_log) == []


def _logged(path: Path, text: str, timeout: float = 10.0) -> bool:
    """Whether text appears in the log at path within timeout (a readiness wait)."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _unexpected(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.rstrip().endswith(("UNEXPECTED", "WRONG"))]


def test_unchanged_programs_run_through_a_forwarder_across_the_bridge(bridge):
    bridge.start_attach()
    r = run_guest([NATIVE / "drv_api", PTX, 64], bridge.region, timeout=120)
    # everything but a device address for pinned memory, which no GPU host can give a guest
    # whose memory it does not see (pinned memory is the guest's own pages here)
    assert _unexpected(r.stdout) == ["cuMemHostGetDevicePointer    CUDA_ERROR_NOT_SUPPORTED           UNEXPECTED"], (
        r.stdout + r.stderr + log_text(bridge.fwd)
    )
    assert "pinned async round trip      -                                  ok" in r.stdout
    assert "large round trip             -                                  ok" in r.stdout
    # a vector add of 2^22 floats: its copies are many chunks of the bulk area each way
    r = run_guest([NATIVE / "vecadd_ptx", 1 << 22], bridge.region, timeout=120)
    assert r.returncode == 0 and "vecadd ok n=4194304" in r.stdout, r.stdout + r.stderr
    # each process's link ended in order when it closed its channel
    deadline = time.monotonic() + 10
    while bridge.serve_log.read_text().count(" ended: ") < 2:
        assert time.monotonic() < deadline, bridge.serve_log.read_text()
        time.sleep(0.05)
    assert bridge.serve_log.read_text().count(f"guest {GUEST} served as channel") == 2
    # records the guest sent back to back (its async calls) crossed several to a write
    counts = [
        (int(m[0]), int(m[1])) for m in re.findall(r"(\d+) records in (\d+) writes", bridge.attach_log.read_text())
    ]
    assert len(counts) == 2 and counts[0][1] < counts[0][0], counts
    assert "SIMULATED" in log_text(bridge.fwd)


def test_the_forwarders_quota_holds_across_the_bridge(bridge):
    bridge.start_attach()
    r = run_guest([NATIVE / "hold", "300"], bridge.region, input="\n")
    assert r.stdout.strip() == "alloc failed", r.stdout + r.stderr  # 300 MiB of a 256 MiB quota


def test_a_guest_with_a_token_that_is_not_its_own_is_refused(bridge, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("ab" * 32 + "\n")
    wrong.chmod(0o600)
    p = bridge.try_attach(bridge.fingerprint, wrong)
    assert p.wait(timeout=20) == 2
    assert "refused: this token is not the guest's" in bridge.attach_log.read_text()
    assert _logged(bridge.serve_log, "a wrong token for guest remote-guest")
    assert not bridge.region.exists()
    # serve goes on: the guest with its token gets its GPU
    bridge.start_attach()
    assert run_guest([NATIVE / "vecadd_ptx", 4096], bridge.region).returncode == 0


def test_attach_refuses_a_host_whose_certificate_it_did_not_pin(bridge):
    other = "0" * 64
    p = bridge.try_attach(other, bridge.token_file)
    assert p.wait(timeout=20) == 2
    assert "certificate is not the pinned one" in bridge.attach_log.read_text()
    assert not bridge.region.exists()


def test_a_token_file_others_can_read_is_refused(bridge):
    bridge.token_file.chmod(0o644)
    p = bridge.try_attach(bridge.fingerprint, bridge.token_file)
    assert p.wait(timeout=20) == 2
    assert "that only you can read" in bridge.attach_log.read_text()


def test_a_token_file_is_its_64_digits_with_or_without_a_newline_and_nothing_else(bridge):
    for text in (bridge.token[:-1] + "\n", bridge.token + "0", bridge.token + "\nx", bridge.token.upper()):
        bridge.token_file.write_text(text)
        p = bridge.try_attach(bridge.fingerprint, bridge.token_file)
        assert p.wait(timeout=20) == 2 and "does not hold a token" in bridge.attach_log.read_text(), text
    bridge.token_file.write_text(bridge.token)  # no newline
    bridge.start_attach()
    assert run_guest([NATIVE / "vecadd_ptx", 4096], bridge.region).returncode == 0


def test_a_peer_that_speaks_no_tls_is_refused_and_serve_goes_on(bridge):
    with socket.create_connection(bridge.addr, timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\x00" * 4096)
        s.settimeout(10)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
    assert _logged(bridge.serve_log, "no TLS handshake"), bridge.serve_log.read_text()
    bridge.start_attach()
    assert run_guest([NATIVE / "vecadd_ptx", 4096], bridge.region).returncode == 0


def _note(pos: int, length: int, direction: int) -> bytes:
    return nb.NOTE.pack(pos, length, direction, 0)


# What a hostile guest with the right token sends on its channel's link, and what serve says.
HOSTILE = {
    "bulk-bytes-not-noted": ([(nb.F_BULK, 0, b"\x01" * 64)], "bulk bytes the guest did not note"),
    "request-before-its-bytes": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 64, nb.TO_HOST)), (nb.F_REC, 1, b"\x00" * 16)],
        "a request before the bulk bytes it may name",
    ),
    "note-past-the-bulk-area": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(4 << 20, 8 << 20, nb.TO_HOST))],
        "a bulk note outside the bulk area",
    ),
    "note-at-a-position-not-given": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(4096, 64, nb.FROM_HOST))],
        "a bulk note at a position the bulk area does not give",
    ),
    "bytes-longer-than-noted": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 64, nb.TO_HOST)), (nb.F_BULK, 0, b"\x02" * 128)],
        "bulk bytes the guest did not note",
    ),
    "a-release-from-the-guest": ([(nb.F_RELEASE, 1 << 40, b"")], "a frame the guest may not send"),
    # the whole bulk area noted for the forwarder to fill, then more: past anything released
    "notes-past-what-was-released": (
        [
            (nb.F_REC, nb.REC_BULK_NOTE, _note(0, 4 << 20, nb.FROM_HOST)),
            (nb.F_REC, nb.REC_BULK_NOTE, _note(4 << 20, 64, nb.FROM_HOST)),
        ],
        "a bulk note past what the forwarder released",
    ),
    "more-ranges-than-allowed": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(64 * i, 64, nb.FROM_HOST)) for i in range(65)],
        "more bulk ranges in flight than the protocol allows",
    ),
    "note-without-a-direction": ([(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 64, 0))], "a bulk note outside the bulk area"),
    "note-with-an-unknown-direction": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 64, 4))],
        "a bulk note outside the bulk area",
    ),
    "note-of-no-bytes": ([(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 0, nb.TO_HOST))], "a bulk note outside the bulk area"),
    "note-not-in-cache-lines": (
        [(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 100, nb.TO_HOST))],
        "a bulk note outside the bulk area",
    ),
    "note-with-padding-set": (
        [(nb.F_REC, nb.REC_BULK_NOTE, nb.NOTE.pack(0, 64, nb.TO_HOST, 7))],
        "a bulk note outside the bulk area",
    ),
    "a-short-note": ([(nb.F_REC, nb.REC_BULK_NOTE, b"\x00" * 12)], "a malformed bulk note"),
    "a-padding-record": ([(nb.F_REC, 0, b"\x00" * 8)], "a frame the guest may not send"),
    "a-second-hello": ([(nb.F_HELLO, 0, b"vmgpu-net 1 channel x y")], "a frame the guest may not send"),
    "a-transport-record": ([(nb.F_REC, 0xFF07, b"\x00" * 8)], "a frame the guest may not send"),
    # a header saying 1 MiB (within the bulk area, past any request) and none of its bytes: refused
    # at the header, not waited for
    "a-record-longer-than-a-request": ([(nb.F_REC, 1, b"", 1 << 20)], "a record longer than any request"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_guest_breaking_the_link_protocol_loses_its_link_and_nothing_else(bridge, case):
    frames, why = HOSTILE[case]
    bridge.start_attach()
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token)
    assert peer.kind == nb.F_WELCOME and peer.payload.startswith(b"channel "), peer.payload
    for kind, aux, payload, *length in frames:
        peer.send(kind, aux, payload, *length)
    assert peer.closed_by_peer()
    peer.close()
    assert _logged(bridge.serve_log, why), bridge.serve_log.read_text()
    assert bridge.fwd.proc.poll() is None
    r = run_guest([NATIVE / "vecadd_ptx", 1 << 20], bridge.region)
    assert r.returncode == 0, r.stdout + r.stderr + bridge.serve_log.read_text()


def test_a_guest_that_stops_in_the_middle_of_its_bulk_bytes_loses_its_link_and_nothing_else(bridge):
    """Bulk bytes are read straight into the forwarder's bulk area: a guest that sends half of
    them and goes leaves a range half-written that no request names; its link ends, the forwarder
    takes its channel back, and the next guest process's copies come back right."""
    bridge.start_attach()
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token)
    assert peer.kind == nb.F_WELCOME, peer.payload
    peer.send(nb.F_REC, nb.REC_BULK_NOTE, _note(0, 64 << 10, nb.TO_HOST))
    peer.send(nb.F_BULK, 0, b"\x5a" * (20 << 10), length=64 << 10)  # 20 KiB of the 64 noted
    time.sleep(0.3)
    peer.close()
    assert _logged(bridge.serve_log, " ended: "), bridge.serve_log.read_text()
    assert bridge.fwd.proc.poll() is None
    r = run_guest([NATIVE / "vecadd_ptx", 1 << 20], bridge.region)
    assert r.returncode == 0, r.stdout + r.stderr + bridge.serve_log.read_text()


def test_a_frame_longer_than_the_protocol_allows_is_refused_before_it_is_read(bridge):
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token)
    peer.send(nb.F_REC, 1, b"", length=0xFFFFFFF0)  # a header claiming 4 GiB, no bytes
    assert peer.closed_by_peer()
    assert _logged(bridge.serve_log, "a frame longer than any the protocol sends"), bridge.serve_log.read_text()


def test_a_hello_without_the_right_token_gets_nothing(bridge, tmp_path):
    peer = nb.RawPeer(bridge.addr, GUEST, "cd" * 32)
    assert peer.kind == nb.F_REFUSED and b"not the guest's" in peer.payload
    assert peer.closed_by_peer()
    # another guest's name with this token, a name that climbs out of the directory, a name
    # this host does not serve: the same answer, and nothing read outside the directory
    (tmp_path / "outside").write_text(f"{bridge.fwd_region} {bridge.token_sha}\n")
    for name in ("other-guest", "../outside", "nobody"):
        peer = nb.RawPeer(bridge.addr, name, bridge.token)
        assert peer.kind == nb.F_REFUSED, name
    assert _logged(bridge.serve_log, "a guest this host does not serve for guest other-guest")
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token, purpose="shell")
    assert peer.kind == nb.F_REFUSED


def test_a_guest_entry_someone_else_could_write_is_not_trusted(bridge):
    entry = bridge.guests / GUEST
    entry.chmod(0o622)
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token)
    assert peer.kind == nb.F_REFUSED
    entry.chmod(0o600)
    peer = nb.RawPeer(bridge.addr, GUEST, bridge.token)
    assert peer.kind == nb.F_WELCOME


def test_a_lost_link_is_a_sticky_error_for_the_guest_process_not_a_hang(bridge):
    bridge.start_attach()
    p = subprocess.Popen(
        [str(NATIVE / "hold"), "8"],
        env=guest_env(bridge.region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().startswith("held "), p.stderr.read()
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "alloc 0"
        nb.stop(bridge.serve, signal.SIGKILL)  # the GPU host's bridge and its links die at once
        answers = []
        for _ in range(2):
            p.stdin.write("\n")
            p.stdin.flush()
            answers.append(p.stdout.readline().strip())
        assert answers == ["alloc 46", "alloc 46"]  # CUDA_ERROR_DEVICE_UNAVAILABLE, and it stays
    finally:
        p.kill()
        p.wait()
    assert _logged(bridge.attach_log, "link closed")
    # the forwarder saw its channel's owner (serve's child) end, and serves the next one
    assert bridge.fwd.proc.poll() is None


def test_a_peer_that_stops_after_the_handshake_is_dropped_and_holds_nothing(bridge):
    """TLS done, then silence (or half a frame header): its process is gone within the hello's
    bound, and serve serves the next peer."""
    peers = []
    for partial in (b"", nb.FRAME.pack(nb.F_HELLO, 40, 0)[:7]):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(socket.create_connection(bridge.addr, timeout=30))
        s.sendall(partial)
        peers.append(s)
    for s in peers:
        s.settimeout(30)
        try:
            assert s.recv(1) == b""  # closed by serve
        except OSError:
            pass
        s.close()
    assert _logged(bridge.serve_log, "no hello", timeout=30)
    bridge.start_attach()
    assert run_guest([NATIVE / "vecadd_ptx", 4096], bridge.region).returncode == 0


def test_serve_holds_a_bounded_number_of_links_and_recovers(bridge):
    idle = [socket.create_connection(bridge.addr, timeout=10) for _ in range(260)]
    try:
        assert _logged(bridge.serve_log, "links already (the most this bridge serves)", timeout=30)
    finally:
        for c in idle:
            c.close()
    # the idle ones gone, a guest is served again
    deadline = time.monotonic() + 30
    while True:
        bridge.attach_log.write_text("")
        p = bridge.try_attach(bridge.fingerprint, bridge.token_file)
        try:
            ok = _logged(bridge.attach_log, "the GPU is at", timeout=15)
        finally:
            if not ok:
                nb.stop(p)
                bridge.region.unlink(missing_ok=True)
        if ok:
            bridge.attach = p
            break
        assert time.monotonic() < deadline, bridge.serve_log.read_text()[-2000:]
    assert run_guest([NATIVE / "vecadd_ptx", 4096], bridge.region).returncode == 0


# ---- a hostile serve: what attach, on the guest's machine, does with frames it must not take ----

GEOMETRY = struct.Struct("<IIIIIIQQ")


class FakeServe:
    """A TLS server with serve's certificate that welcomes attach and then sends what a test
    gives it on each channel link."""

    def __init__(self, tmp: Path, geometry: bytes, on_channel):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.geometry, self.on_channel = geometry, on_channel
        self.links = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw) -> None:
        try:
            s = self.ctx.wrap_socket(raw, server_side=True)
            head = _read(s, nb.FRAME.size)
            kind, n, _ = nb.FRAME.unpack(head)
            purpose = _read(s, n).split()[2]
            if purpose == b"geometry":
                s.sendall(nb.FRAME.pack(nb.F_WELCOME, len(self.geometry), 0) + self.geometry)
                s.close()
                return
            s.sendall(nb.FRAME.pack(nb.F_WELCOME, 9, 0) + b"channel 0")
            self.links += 1
            self.on_channel(s)
        except (OSError, ssl.SSLError, ConnectionError):
            pass

    def close(self) -> None:
        self.sock.close()


def _read(s, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _honest_geometry(bulk: int = 4 << 20) -> bytes:
    return GEOMETRY.pack(1, 16, 256 << 10, 64 << 10, 1, 0, bulk, 64 << 10)


@pytest.fixture
def secrets_dir(tmp_path):
    fp, token, _ = nb.secrets_in(tmp_path)
    return tmp_path, fp, token


def test_attach_refuses_a_geometry_it_cannot_carry(secrets_dir, shm_path):
    tmp, fp, token = secrets_dir
    for geometry, why in (
        (_honest_geometry(bulk=4 << 30), "sent a geometry this bridge does not understand"),
        (GEOMETRY.pack(1, 0, 256 << 10, 64 << 10, 1, 0, 4 << 20, 64 << 10), "does not understand"),
        (b"\x01" * 7, "does not understand"),
    ):
        fake = FakeServe(tmp, geometry, lambda s: None)
        log = tmp / "attach.log"
        log.write_text("")
        p = nb.attach(shm_path, f"127.0.0.1:{fake.port}", GUEST, fp, token, log, wait=False)
        assert p.wait(timeout=20) == 2 and why in log.read_text(), log.read_text()
        assert not shm_path.exists()
        fake.close()


# what a hostile serve sends on a link, and what attach says
HOSTILE_SERVE = {
    "bytes-for-no-range": (nb.F_BULK, 0, b"\x07" * 64, "bulk bytes for a range the guest did not ask to be filled"),
    "a-transport-record": (nb.F_REC, nb.REC_BULK_NOTE, b"\x00" * 24, "a frame serve may not send"),
    "a-hello": (nb.F_HELLO, 0, b"x", "a frame serve may not send"),
    "a-release-with-bytes": (nb.F_RELEASE, 64, b"\x00" * 8, "a frame serve may not send"),
    # a header saying 1 MiB (within the bulk area, past any completion) and none of its bytes
    "a-record-longer-than-a-completion": (nb.F_REC, 1, b"", "a record longer than any completion", 1 << 20),
}


@pytest.mark.parametrize("case", list(HOSTILE_SERVE))
def test_a_hostile_serve_loses_the_guest_process_its_link_and_nothing_else(secrets_dir, shm_path, case):
    kind, aux, payload, why, *length = HOSTILE_SERVE[case]
    tmp, fp, token = secrets_dir

    def on_channel(s):
        s.sendall(nb.FRAME.pack(kind, length[0] if length else len(payload), aux) + payload)
        time.sleep(5)

    fake = FakeServe(tmp, _honest_geometry(), on_channel)
    log = tmp / "attach.log"
    attach = nb.attach(shm_path, f"127.0.0.1:{fake.port}", GUEST, fp, token, log)
    try:
        # a guest process's first call crosses; the answer is the hostile frame
        r = run_guest([NATIVE / "hold", "0"], shm_path, timeout=60)
        assert r.returncode != 0 and "free" not in r.stdout, r.stdout + r.stderr
        assert _logged(log, why), log.read_text()
        # attach and its region are whole: the next process gets a link of its own
        assert attach.poll() is None and shm_path.exists()
        before = fake.links
        run_guest([NATIVE / "hold", "0"], shm_path, timeout=60)
        assert fake.links == before + 1
    finally:
        nb.stop(attach)
        fake.close()
    assert not shm_path.exists()


class _StallingProxy:
    """A TCP relay between attach and serve that stops reading serve's side for 20 ms of every
    40: serve's socket fills and its writes back up, as over a network slower than the copy.
    (TLS is end to end; attach pins serve's certificate, not its address.)"""

    def __init__(self, serve_port: int):
        self.serve_port, self.stop = serve_port, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.stalls = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.serve_port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            threading.Thread(target=self._pump, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, True), daemon=True).start()

    def _pump(self, src, dst, stall):
        t = time.monotonic()
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if stall and time.monotonic() - t > 0.02:
                    time.sleep(0.02)
                    self.stalls += 1
                    t = time.monotonic()
        except OSError:
            pass
        for x in (src, dst):
            with contextlib.suppress(OSError):
                x.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.stop.set()
        self.sock.close()


def test_copies_from_the_gpu_survive_a_link_that_backs_up(bridge):
    """Copies carried over a link that backs up, as over a network slower than the copy: the
    link from serve stops for 20 ms of every 40 while a vector add copies 64 MiB arrays each way,
    so serve's writes wait for the socket (OpenSSL asks for them to be retried) and its bulk
    frames, now written from the forwarder's bulk area and read straight into the guest's, cross
    in pieces; the results come back right and the guest process keeps its link."""
    proxy = _StallingProxy(bridge.port)
    try:
        bridge.attach = nb.attach(
            bridge.region, f"127.0.0.1:{proxy.port}", GUEST, bridge.fingerprint, bridge.token_file, bridge.attach_log
        )
        r = run_guest([NATIVE / "vecadd_ptx", 1 << 24], bridge.region, timeout=300)
    finally:
        proxy.close()
    assert r.returncode == 0 and f"vecadd ok n={1 << 24}" in r.stdout, (
        r.stdout + r.stderr + bridge.serve_log.read_text()[-2000:]
    )
    assert proxy.stalls > 10, proxy.stalls
