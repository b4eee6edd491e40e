"""Talking to vmgpud: the CLI and the hooks use this.  Connection retries are bounded
(a named tenacity policy); domain errors come back as the same VmgpuError subclasses."""

from __future__ import annotations

import grpc
import tenacity

from vmgpu import errors
from vmgpu.api.v1 import vmgpu_pb2 as pb
from vmgpu.api.v1 import vmgpu_pb2_grpc as pb_grpc


def rpc_retry(seconds: float) -> dict:
    """The named policy for a daemon being (re)started: retry while it is unavailable, for
    `seconds` at most, then say so."""
    return dict(
        retry=tenacity.retry_if_exception(
            lambda e: isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE
        ),
        stop=tenacity.stop_after_delay(seconds),
        wait=tenacity.wait_exponential(multiplier=0.05, max=0.5),
        reraise=True,
    )


class Client:
    def __init__(self, socket_path: str, timeout: float = 10.0, retry_s: float = 5.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.retry = rpc_retry(retry_s)
        self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub = pb_grpc.VmgpudStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def _rpc(self, method, request):
        try:
            for attempt in tenacity.Retrying(**self.retry):
                with attempt:
                    return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            code = dict(e.trailing_metadata() or ()).get("vmgpu-error")
            if code in errors.BY_CODE:
                raise errors.BY_CODE[code](e.details()) from None
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise errors.DaemonUnavailable(
                    f"vmgpud is not answering on {self.socket_path} (is `vmgpu daemon` running?)"
                ) from None
            raise errors.VmgpuError(f"vmgpud: {e.code().name}: {e.details()}") from None

    def admit(self, guest: str, kind: str, spec: str, label: str = "") -> pb.AdmitReply:
        return self._rpc(self.stub.Admit, pb.AdmitRequest(guest=guest, kind=kind, spec=spec, label=label))

    def release(self, guest: str) -> bool:
        return self._rpc(self.stub.Release, pb.ReleaseRequest(guest=guest)).released

    def status(self) -> pb.StatusReply:
        return self._rpc(self.stub.Status, pb.StatusRequest())

    def start_forwarder(
        self, guest: str, region: str, backend: str = "cuda", size: str = "", wait: str = "futex"
    ) -> int:
        req = pb.StartForwarderRequest(guest=guest, region=region, backend=backend, size=size, wait=wait)
        return self._rpc(self.stub.StartForwarder, req).pid

    def set_weight(self, guest: str, gpu: str, weight: int) -> pb.SetWeightReply:
        return self._rpc(self.stub.SetWeight, pb.SetWeightRequest(guest=guest, gpu=gpu, weight=weight))

    def set_cap(self, guest: str, gpu: str, cap: int) -> pb.SetWeightReply:
        return self._rpc(self.stub.SetCap, pb.SetCapRequest(guest=guest, gpu=gpu, cap=cap))

    def set_priority(self, guest: str, gpu: str, priority: str) -> pb.SetWeightReply:
        return self._rpc(self.stub.SetPriority, pb.SetPriorityRequest(guest=guest, gpu=gpu, priority=priority))

    def set_policy(self, gpu: str, policy: str) -> pb.SetPolicyReply:
        return self._rpc(self.stub.SetPolicy, pb.SetPolicyRequest(gpu=gpu, policy=policy))

    def stop_forwarder(self, guest: str) -> bool:
        return self._rpc(self.stub.StopForwarder, pb.StopForwarderRequest(guest=guest)).stopped
