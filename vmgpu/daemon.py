"""vmgpud: the host daemon.  Keeps the admission ledger and answers on a unix socket (gRPC).

The servicer is thin: it converts messages, calls the ledger, converts back.  Domain errors
become gRPC status codes in one table (`STATUS`), with the vmgpu error code in the trailing
metadata so that clients rebuild the same error.
"""

from __future__ import annotations

import os
import signal
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
        f = pb.Forwarder(guest=guest, pid=pid, region=region, backend=backend)
        st = self.supervisor.stats(guest)
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


def serve(
    socket_path: str | Path, db_path: str | Path, inventory: str | Path | None = None, metrics_port: int | None = None
):
    """Start vmgpud; returns (server, ledger).  The socket is owner-only (0600) in an
    owner-only directory.  metrics_port: serve Prometheus metrics on 127.0.0.1 (0: any free
    port, None: no endpoint); the HTTP server is server.metrics_http."""
    socket_path, db_path = Path(socket_path), Path(db_path)
    # root's alone: the forwarders' logs and statistics are made in the state directory
    files.private_dir(socket_path.parent)
    files.private_dir(db_path.parent)
    ledger = Ledger(db_path)
    ledger.sync_gpus(gpu.inventory(inventory))
    lock = threading.Lock()
    supervisor = Supervisor(ledger, lock, db_path.parent)
    with lock:
        supervisor.adopt()
    supervisor.watch()
    if socket_path.exists():
        socket_path.unlink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    metrics = Metrics(ledger, lock)
    pb_grpc.add_VmgpudServicer_to_server(Servicer(ledger, supervisor, lock, metrics), server)
    server.supervisor = supervisor
    server.metrics_http = metrics.serve(metrics_port) if metrics_port is not None else None
    old = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{socket_path}")
        server.start()
    finally:
        os.umask(old)
    os.chmod(socket_path, 0o600)
    get_logger(component="vmgpud").info("serving", socket=str(socket_path), db=str(db_path), gpus=len(ledger.usage()))
    return server, ledger


def run(socket_path, db_path, inventory=None, metrics_port=None) -> None:
    """Serve until SIGTERM or SIGINT."""
    server, ledger = serve(socket_path, db_path, inventory, metrics_port)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(grace=2).wait()
    if server.metrics_http:
        server.metrics_http.shutdown()
    server.supervisor.close()
    ledger.close()
    get_logger(component="vmgpud").info("stopped")
