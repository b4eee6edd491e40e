"""vmgpud: the host daemon.  Keeps the admission ledger and answers on a unix socket (gRPC).

The servicer is thin: it converts messages, calls the ledger, converts back.  Domain errors
become gRPC status codes in one table (`STATUS`), with the vmgpu error code in the trailing
metadata so that clients rebuild the same error.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import threading
from concurrent import futures
from pathlib import Path

import grpc

from vmgpu import errors, files, gpu, names, sched
from vmgpu.api.v1 import vmgpu_pb2 as pb
from vmgpu.api.v1 import vmgpu_pb2_grpc as pb_grpc
from vmgpu.ledger import Ledger
from vmgpu.logging import get_logger
from vmgpu.metrics import Metrics
from vmgpu.spec import parse
from vmgpu.supervisor import Supervisor

DEFAULT_SOCKET = "/run/vmgpu/vmgpud.sock"
DEFAULT_DB = "/var/lib/vmgpu/ledger.db"
KINDS = ("vm", "container", "process")

# vmgpu error -> gRPC status; the only place the mapping lives
STATUS = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Refused: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Conflict: grpc.StatusCode.ALREADY_EXISTS,
    errors.GpuError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.VmgpuError: grpc.StatusCode.INTERNAL,
}


def _slice(r) -> pb.Slice:
    return pb.Slice(
        guest=r.guest,
        gpu_index=r.gpu_index,
        gpu_uuid=r.gpu_uuid,
        mem_mib=r.mem_mib,
        compute_pct=r.compute_pct,
        kind=r.kind,
        weight=r.weight or r.compute_pct,
    )


class Servicer(pb_grpc.VmgpudServicer):
    def __init__(self, ledger: Ledger, supervisor: Supervisor, lock: threading.Lock, metrics: Metrics):
        self.ledger = ledger
        self.supervisor = supervisor
        self.lock = lock
        self.metrics = metrics

    @staticmethod
    def _abort(context, e: errors.VmgpuError):
        """End the call with e: its gRPC status, its stable code in trailing metadata."""
        status = next(s for cls, s in STATUS.items() if isinstance(e, cls))
        context.set_trailing_metadata((("vmgpu-error", e.code),))
        context.abort(status, e.message)

    def _guest(self, context, name: str) -> None:
        """Every call that takes a guest name: the one rule (vmgpu/names.py), or INVALID_ARGUMENT."""
        try:
            names.check_guest(name)
        except errors.InvalidArgument as e:
            self._abort(context, e)

    def _call(self, context, fn, *args):
        try:
            with self.lock:
                return fn(*args)
        except errors.VmgpuError as e:
            self._abort(context, e)

    def Admit(self, request, context):
        if request.kind not in KINDS:
            self._abort(context, errors.InvalidArgument(f"kind '{request.kind}' is not one of {', '.join(KINDS)}"))
        self._guest(context, request.guest)

        def admit():
            try:
                res = self.ledger.admit(request.guest, request.kind, parse(request.spec))
            except errors.VmgpuError as e:
                self.metrics.admissions.labels(result=e.code.lower()).inc()
                raise
            self.metrics.admissions.labels(result="admitted").inc()
            return res

        res = self._call(context, admit)
        return pb.AdmitReply(slices=[_slice(r) for r in res])

    def Release(self, request, context):
        self._guest(context, request.guest)

        def release():
            self.supervisor.stop(request.guest)
            return self.ledger.release(request.guest)

        return pb.ReleaseReply(released=self._call(context, release))

    def _forwarder(self, guest, pid, region, backend) -> pb.Forwarder:
        state, attempt, why = self.supervisor.state(guest, pid, region)
        f = pb.Forwarder(guest=guest, pid=pid, region=region, backend=backend, state=state)
        f.restart_attempt, f.restart_error = attempt, why
        st = self.supervisor.stats(guest) if state == "running" else None
        if st:
            f.mem_used_mib.extend(m["used"] >> 20 for m in st["memory"])
            f.processes, f.sync_calls, f.async_calls = st["processes"], st["sync_calls"], st["async_calls"]
        return f

    def StartForwarder(self, request, context):
        self._guest(context, request.guest)
        backend = request.backend or "cuda"
        if backend not in ("cuda", "sim"):
            self._abort(context, errors.InvalidArgument(f"backend '{backend}' is neither cuda nor sim"))
        wait = request.wait or "futex"
        if wait not in ("futex", "poll"):
            self._abort(context, errors.InvalidArgument(f"wait '{wait}' is neither futex nor poll"))
        pid = self._call(context, self.supervisor.start, request.guest, request.region, backend, request.size, wait)
        return pb.StartForwarderReply(pid=pid)

    def StopForwarder(self, request, context):
        self._guest(context, request.guest)
        return pb.StopForwarderReply(stopped=self._call(context, self.supervisor.stop, request.guest))

    def SetWeight(self, request, context):
        self._guest(context, request.guest)
        uuid = self._call(context, self.ledger.set_weight, request.guest, request.gpu, request.weight)
        return pb.SetWeightReply(gpu_uuid=uuid, live=sched.apply(uuid, weights={request.guest: request.weight}))

    def SetPolicy(self, request, context):
        uuid = self._call(context, self.ledger.set_policy, request.gpu, request.policy)
        return pb.SetPolicyReply(gpu_uuid=uuid, live=sched.apply(uuid, policy=request.policy))

    def Status(self, request, context):
        usage, slices, fwds = self._call(
            context, lambda: (self.ledger.usage(), self.ledger.reservations(), self.ledger.forwarders())
        )
        return pb.StatusReply(
            gpus=[
                pb.GpuStatus(
                    index=u.index,
                    uuid=u.uuid,
                    name=u.name,
                    mem_mib=u.mem_mib,
                    mem_reserved_mib=u.mem_reserved_mib,
                    compute_reserved_pct=u.compute_reserved_pct,
                    policy=u.policy,
                )
                for u in usage
            ],
            slices=[_slice(r) for r in slices],
            forwarders=[self._forwarder(g, pid, region, b) for g, pid, region, b, _ in fwds],
        )


class SocketClaim:
    """vmgpud's hold on its socket path.  An exclusive lock on SOCKET.lock (a plain file of
    its own, no link, in a directory only its owner can write) says which vmgpud serves
    SOCKET; a second one is refused, naming the first's pid.  gRPC listens on a private name
    (it unlinks that name when it stops); SOCKET is a hard link to the same socket, replaced
    only while the lock is held and unlinked at exit only if it is still that socket."""

    def __init__(self, socket_path: Path):
        self.path = socket_path
        self.lock_path = socket_path.with_name(socket_path.name + ".lock")
        self.private = socket_path.with_name(f".{socket_path.name}.{os.getpid()}")
        self.fd = -1
        self.bound: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket this vmgpud made

    def take(self) -> SocketClaim:
        # root's alone: the forwarders' logs and statistics are made in the state directory too
        d = files.private_dir(self.path.parent)
        try:
            self.fd = files.open_ours(self.lock_path, os.O_RDWR | os.O_CREAT, others=0)
        except errors.UnsafePath as e:
            raise errors.VmgpuError(f"{self.lock_path} is not vmgpud's lock file: {e.message}") from None
        except OSError as e:
            raise errors.VmgpuError(f"cannot open vmgpud's lock file {self.lock_path}: {e.strerror}") from None
        os.set_blocking(self.fd, True)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "unknown"
            self.release()
            raise errors.DaemonRunning(
                f"another vmgpud (pid {holder}) is serving {self.path}: stop it first, "
                f"or give this one another --socket"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        # what a vmgpud that died left here is stale now (the lock is ours): its private names
        for old in d.glob(f".{self.path.name}.*"):
            if old.name.removeprefix(f".{self.path.name}.").isdigit() and stat.S_ISSOCK(os.lstat(old).st_mode):
                old.unlink()
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return self
        if not stat.S_ISSOCK(mode):
            self.release()
            raise errors.VmgpuError(f"{self.path} exists and is not a socket: move it away, or choose another --socket")
        return self

    def publish(self) -> None:
        """Give the socket gRPC listens on (at self.private) its public name."""
        os.chmod(self.private, 0o600)
        st = os.lstat(self.private)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        os.link(self.private, tmp)
        os.replace(tmp, self.path)  # a stale socket of a dead vmgpud goes; we hold the lock
        self.bound = (st.st_dev, st.st_ino)

    def release(self) -> None:
        """Unlink the public name if it is still our socket; let go of the lock."""
        if self.bound is not None:
            try:
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == self.bound:
                    self.path.unlink()
            except FileNotFoundError:
                pass
            self.bound = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def serve(
    socket_path: str | Path, db_path: str | Path, inventory: str | Path | None = None, metrics_port: int | None = None
):
    """Start vmgpud; returns (server, ledger).  The socket is owner-only (0600) in an
    owner-only directory, held by one vmgpud at a time (server.socket_claim; release() it
    after stopping the server).  metrics_port: serve Prometheus metrics on 127.0.0.1 (0: any
    free port, None: no endpoint); the HTTP server is server.metrics_http."""
    socket_path, db_path = Path(socket_path), Path(db_path)
    claim = SocketClaim(socket_path).take()
    try:
        try:
            files.private_dir(db_path.parent)
        except OSError as e:
            raise errors.LedgerError(
                f"cannot make the ledger's directory {db_path.parent}: {e.strerror}: make it writable by root, "
                f"or choose another --db"
            ) from None
        ledger = Ledger(db_path)
        try:
            server = _start(claim, ledger, inventory, db_path, metrics_port)
        except BaseException:
            ledger.close()
            raise
    except BaseException:
        claim.release()
        raise
    get_logger(component="vmgpud").info("serving", socket=str(socket_path), db=str(db_path), gpus=len(ledger.usage()))
    return server, ledger


def _start(claim: SocketClaim, ledger: Ledger, inventory, db_path: Path, metrics_port: int | None):
    ledger.sync_gpus(gpu.inventory(inventory))
    lock = threading.Lock()
    supervisor = Supervisor(ledger, lock, db_path.parent)
    with lock:
        supervisor.adopt()
    supervisor.watch()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    metrics = Metrics(ledger, lock)
    pb_grpc.add_VmgpudServicer_to_server(Servicer(ledger, supervisor, lock, metrics), server)
    server.supervisor = supervisor
    server.socket_claim = claim
    server.metrics_http = metrics.serve(metrics_port) if metrics_port is not None else None
    old = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{claim.private}")
        server.start()
    finally:
        os.umask(old)
    claim.publish()
    return server


def run(socket_path, db_path, inventory=None, metrics_port=None) -> None:
    """Serve until SIGTERM or SIGINT."""
    server, ledger = serve(socket_path, db_path, inventory, metrics_port)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(grace=2).wait()
    server.socket_claim.release()
    if server.metrics_http:
        server.metrics_http.shutdown()
    server.supervisor.close()
    ledger.close()
    get_logger(component="vmgpud").info("stopped")
