"""vmgpud: the host daemon.  Serves the service (vmgpu/service.py) on a unix socket (gRPC).

The servicer is thin: it converts messages, calls the service, converts back.  One interceptor
(`ErrorInterceptor`) ends every call that raised a VmgpuError with the gRPC status of the code
table (vmgpu/errors.py), the vmgpu error code in the trailing metadata, so that clients rebuild
the same error (vmgpu/client.py).
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

from vmgpu import errors, files
from vmgpu.api.v1 import vmgpu_pb2 as pb
from vmgpu.api.v1 import vmgpu_pb2_grpc as pb_grpc
from vmgpu.ledger import Ledger, Reservation
from vmgpu.logging import get_logger
from vmgpu.service import Service
from vmgpu.supervisor import HostSettings


def grpc_status(e: errors.VmgpuError) -> grpc.StatusCode:
    """e's gRPC status, from the code table."""
    return getattr(grpc.StatusCode, e.grpc_status)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Every RPC's VmgpuError ends the call with its status and its code (trailing metadata)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def call(request, context):
            try:
                return inner(request, context)
            except errors.VmgpuError as e:
                context.set_trailing_metadata((("vmgpu-error", e.code),))
                context.abort(grpc_status(e), e.message)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def _message(message_cls, obj, **override):
    """A message of message_cls with every field taken from obj's attribute of the same name
    (service objects and messages name their fields alike; a field obj lacks is an error)."""
    return message_cls(**{**{f.name: getattr(obj, f.name) for f in message_cls.DESCRIPTOR.fields}, **override})


def _slice(r: Reservation) -> pb.Slice:
    return _message(pb.Slice, r, weight=r.weight or r.compute_pct)


class Servicer(pb_grpc.VmgpudServicer):
    """Messages in, the service's call, messages out; errors go to ErrorInterceptor."""

    def __init__(self, service: Service):
        self.service = service

    def Admit(self, request, context):
        slices = self.service.admit(request.guest, request.kind, request.spec, request.label)
        return pb.AdmitReply(slices=[_slice(r) for r in slices])

    def Release(self, request, context):
        return pb.ReleaseReply(released=self.service.release(request.guest))

    def StartForwarder(self, request, context):
        r = request
        return pb.StartForwarderReply(pid=self.service.start(r.guest, r.region, r.backend, r.size, r.wait))

    def StopForwarder(self, request, context):
        return pb.StopForwarderReply(stopped=self.service.stop(request.guest))

    def SetWeight(self, request, context):
        uuid, live = self.service.weight(request.guest, request.gpu, request.weight)
        return pb.SetWeightReply(gpu_uuid=uuid, live=live)

    def SetCap(self, request, context):
        uuid, live = self.service.cap(request.guest, request.gpu, request.cap)
        return pb.SetWeightReply(gpu_uuid=uuid, live=live)

    def SetPriority(self, request, context):
        uuid, live = self.service.priority(request.guest, request.gpu, request.priority)
        return pb.SetWeightReply(gpu_uuid=uuid, live=live)

    def SetPolicy(self, request, context):
        uuid, live = self.service.policy(request.gpu, request.policy)
        return pb.SetPolicyReply(gpu_uuid=uuid, live=live)

    def Status(self, request, context):
        st = self.service.status()
        return pb.StatusReply(
            gpus=[_message(pb.GpuStatus, u) for u in st.gpus],
            slices=[_slice(r) for r in st.slices],
            forwarders=[_message(pb.Forwarder, f) for f in st.forwarders],
            settings=pb.HostSettings(
                oom_scripts_dir=st.settings.oom_scripts_dir,
                oom_script=st.settings.oom_script,
                ctx_reserve_bytes=-1 if st.settings.ctx_reserve is None else st.settings.ctx_reserve,
                peer_timeout_s=st.settings.peer_timeout_s,
                mps_dir=st.settings.mps_dir,
                mps_pid=st.mps_pid,
            ),
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
    socket_path: str | Path,
    db_path: str | Path,
    inventory: str | Path | None = None,
    metrics_port: int | None = None,
    settings: HostSettings | None = None,
):
    """Start vmgpud; returns (server, ledger).  The socket is owner-only (0600) in an
    owner-only directory, held by one vmgpud at a time (server.socket_claim; release() it
    after stopping the server).  metrics_port: serve Prometheus metrics on 127.0.0.1 (0: any
    free port, None: no endpoint); the HTTP server is server.metrics_http.  settings: the
    host's forwarder settings (checked first: vmgpud does not start with ones it cannot apply)."""
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
            server = _start(claim, ledger, inventory, db_path, metrics_port, settings)
        except BaseException:
            ledger.close()
            raise
    except BaseException:
        claim.release()
        raise
    get_logger(component="vmgpud").info("serving", socket=str(socket_path), db=str(db_path), gpus=len(ledger.usage()))
    return server, ledger


def _start(claim: SocketClaim, ledger: Ledger, inventory, db_path: Path, metrics_port: int | None, settings):
    service = Service.open(ledger, inventory, db_path.parent, settings)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[ErrorInterceptor()])
    pb_grpc.add_VmgpudServicer_to_server(Servicer(service), server)
    server.service = service
    server.supervisor = service.supervisor
    server.socket_claim = claim
    server.metrics_http = service.metrics.serve(metrics_port) if metrics_port is not None else None
    old = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{claim.private}")
        server.start()
    finally:
        os.umask(old)
    claim.publish()
    return server


def run(socket_path, db_path, inventory=None, metrics_port=None, settings: HostSettings | None = None) -> None:
    """Serve until SIGTERM or SIGINT.  The handlers are in place before the socket is published: a
    signal that comes as soon as the socket exists (a supervisor stopping a vmgpud it just started)
    still ends it cleanly, not by the default action."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server, ledger = serve(socket_path, db_path, inventory, metrics_port, settings)
    while not done.wait(1.0):  # timed: a signal taken by another thread runs its handler here within 1 s
        pass
    server.stop(grace=2).wait()
    server.socket_claim.release()
    if server.metrics_http:
        server.metrics_http.shutdown()
    server.service.close()
    ledger.close()
    get_logger(component="vmgpud").info("stopped")
