from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SetWeightRequest(_message.Message):
    __slots__ = ("guest", "gpu", "weight")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    guest: str
    gpu: str
    weight: int
    def __init__(self, guest: _Optional[str] = ..., gpu: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class SetCapRequest(_message.Message):
    __slots__ = ("guest", "gpu", "cap")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    guest: str
    gpu: str
    cap: int
    def __init__(self, guest: _Optional[str] = ..., gpu: _Optional[str] = ..., cap: _Optional[int] = ...) -> None: ...

class SetPriorityRequest(_message.Message):
    __slots__ = ("guest", "gpu", "priority")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    guest: str
    gpu: str
    priority: str
    def __init__(self, guest: _Optional[str] = ..., gpu: _Optional[str] = ..., priority: _Optional[str] = ...) -> None: ...

class SetWeightReply(_message.Message):
    __slots__ = ("gpu_uuid", "live")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    live: bool
    def __init__(self, gpu_uuid: _Optional[str] = ..., live: bool = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("gpu", "policy")
    GPU_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    policy: str
    def __init__(self, gpu: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class SetPolicyReply(_message.Message):
    __slots__ = ("gpu_uuid", "live")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    live: bool
    def __init__(self, gpu_uuid: _Optional[str] = ..., live: bool = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("guest", "kind", "spec", "label")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    guest: str
    kind: str
    spec: str
    label: str
    def __init__(self, guest: _Optional[str] = ..., kind: _Optional[str] = ..., spec: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("guest", "gpu_index", "gpu_uuid", "mem_mib", "compute_pct", "kind", "weight", "label", "settings", "guarantee_pct", "cap_pct", "priority")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MEM_MIB_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PCT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_PCT_FIELD_NUMBER: _ClassVar[int]
    CAP_PCT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    guest: str
    gpu_index: int
    gpu_uuid: str
    mem_mib: int
    compute_pct: int
    kind: str
    weight: int
    label: str
    settings: str
    guarantee_pct: int
    cap_pct: int
    priority: str
    def __init__(self, guest: _Optional[str] = ..., gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., mem_mib: _Optional[int] = ..., compute_pct: _Optional[int] = ..., kind: _Optional[str] = ..., weight: _Optional[int] = ..., label: _Optional[str] = ..., settings: _Optional[str] = ..., guarantee_pct: _Optional[int] = ..., cap_pct: _Optional[int] = ..., priority: _Optional[str] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ("slices",)
    SLICES_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[Slice]
    def __init__(self, slices: _Optional[_Iterable[_Union[Slice, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("guest",)
    GUEST_FIELD_NUMBER: _ClassVar[int]
    guest: str
    def __init__(self, guest: _Optional[str] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: bool = ...) -> None: ...

class StartForwarderRequest(_message.Message):
    __slots__ = ("guest", "region", "backend", "size", "wait")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    guest: str
    region: str
    backend: str
    size: str
    wait: str
    def __init__(self, guest: _Optional[str] = ..., region: _Optional[str] = ..., backend: _Optional[str] = ..., size: _Optional[str] = ..., wait: _Optional[str] = ...) -> None: ...

class StartForwarderReply(_message.Message):
    __slots__ = ("pid",)
    PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    def __init__(self, pid: _Optional[int] = ...) -> None: ...

class StopForwarderRequest(_message.Message):
    __slots__ = ("guest",)
    GUEST_FIELD_NUMBER: _ClassVar[int]
    guest: str
    def __init__(self, guest: _Optional[str] = ...) -> None: ...

class StopForwarderReply(_message.Message):
    __slots__ = ("stopped",)
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    stopped: bool
    def __init__(self, stopped: bool = ...) -> None: ...

class Forwarder(_message.Message):
    __slots__ = ("guest", "pid", "region", "backend", "mem_used_mib", "processes", "sync_calls", "async_calls", "state", "restart_attempt", "restart_error", "oom_script", "ctx_reserve_bytes", "peer_timeout_s")
    GUEST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_MIB_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    SYNC_CALLS_FIELD_NUMBER: _ClassVar[int]
    ASYNC_CALLS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESTART_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RESTART_ERROR_FIELD_NUMBER: _ClassVar[int]
    OOM_SCRIPT_FIELD_NUMBER: _ClassVar[int]
    CTX_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEER_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    guest: str
    pid: int
    region: str
    backend: str
    mem_used_mib: _containers.RepeatedScalarFieldContainer[int]
    processes: int
    sync_calls: int
    async_calls: int
    state: str
    restart_attempt: int
    restart_error: str
    oom_script: str
    ctx_reserve_bytes: int
    peer_timeout_s: int
    def __init__(self, guest: _Optional[str] = ..., pid: _Optional[int] = ..., region: _Optional[str] = ..., backend: _Optional[str] = ..., mem_used_mib: _Optional[_Iterable[int]] = ..., processes: _Optional[int] = ..., sync_calls: _Optional[int] = ..., async_calls: _Optional[int] = ..., state: _Optional[str] = ..., restart_attempt: _Optional[int] = ..., restart_error: _Optional[str] = ..., oom_script: _Optional[str] = ..., ctx_reserve_bytes: _Optional[int] = ..., peer_timeout_s: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuStatus(_message.Message):
    __slots__ = ("index", "uuid", "name", "mem_mib", "mem_reserved_mib", "compute_reserved_pct", "policy")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEM_MIB_FIELD_NUMBER: _ClassVar[int]
    MEM_RESERVED_MIB_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_RESERVED_PCT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    mem_mib: int
    mem_reserved_mib: int
    compute_reserved_pct: int
    policy: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., mem_mib: _Optional[int] = ..., mem_reserved_mib: _Optional[int] = ..., compute_reserved_pct: _Optional[int] = ..., policy: _Optional[str] = ...) -> None: ...

class HostSettings(_message.Message):
    __slots__ = ("oom_scripts_dir", "oom_script", "ctx_reserve_bytes", "peer_timeout_s", "mps_dir", "mps_pid")
    OOM_SCRIPTS_DIR_FIELD_NUMBER: _ClassVar[int]
    OOM_SCRIPT_FIELD_NUMBER: _ClassVar[int]
    CTX_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEER_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MPS_DIR_FIELD_NUMBER: _ClassVar[int]
    MPS_PID_FIELD_NUMBER: _ClassVar[int]
    oom_scripts_dir: str
    oom_script: str
    ctx_reserve_bytes: int
    peer_timeout_s: int
    mps_dir: str
    mps_pid: int
    def __init__(self, oom_scripts_dir: _Optional[str] = ..., oom_script: _Optional[str] = ..., ctx_reserve_bytes: _Optional[int] = ..., peer_timeout_s: _Optional[int] = ..., mps_dir: _Optional[str] = ..., mps_pid: _Optional[int] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("gpus", "slices", "forwarders", "settings")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    FORWARDERS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStatus]
    slices: _containers.RepeatedCompositeFieldContainer[Slice]
    forwarders: _containers.RepeatedCompositeFieldContainer[Forwarder]
    settings: HostSettings
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuStatus, _Mapping]]] = ..., slices: _Optional[_Iterable[_Union[Slice, _Mapping]]] = ..., forwarders: _Optional[_Iterable[_Union[Forwarder, _Mapping]]] = ..., settings: _Optional[_Union[HostSettings, _Mapping]] = ...) -> None: ...
