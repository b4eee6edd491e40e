"""One error tree for vmgpu, and the one code table derived from it.  Every error class has a
stable `code`, the `exit_code` the CLI exits with, the `grpc_status` vmgpud answers with (the
name of a grpc.StatusCode; a subclass inherits its parent's) and a help text (its docstring's
first paragraph).  CODES is the table; vmgpu/daemon.py's interceptor, vmgpu/client.py, the CLI
(vmgpu/cli/common.py), the libvirt hook and the OCI runtime all read it, none keeps its own."""

from __future__ import annotations

from typing import NamedTuple


class Code(NamedTuple):
    """One row of the code table."""

    code: str
    exit_code: int
    grpc_status: str
    help: str


ALL: list[type[VmgpuError]] = []  # every class of the tree, in definition order


class VmgpuError(Exception):
    """Something vmgpu could not do; the message says what and how to fix it."""

    code = "VMGPU_ERROR"
    exit_code = 1
    grpc_status = "INTERNAL"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "code" not in cls.__dict__ or "__doc__" not in cls.__dict__ or not cls.__doc__:
            raise TypeError(f"{cls.__name__}: every vmgpu error has its own code and a help text")
        ALL.append(cls)

    @classmethod
    def row(cls) -> Code:
        return Code(cls.code, cls.exit_code, cls.grpc_status, " ".join(cls.__doc__.split("\n\n")[0].split()))


ALL.append(VmgpuError)


class InvalidArgument(VmgpuError):
    """A request that is not well formed: a name, a size, an option; the message names it."""

    code = "INVALID_ARGUMENT"
    exit_code = 2
    grpc_status = "INVALID_ARGUMENT"


class SpecError(InvalidArgument):
    """A share spec that cannot be used; the message names the slice and the field."""

    code = "INVALID_SPEC"


class NotFound(VmgpuError):
    """What the request names does not exist: a guest, a GPU, a region."""

    code = "NOT_FOUND"
    exit_code = 3
    grpc_status = "NOT_FOUND"


class RegionError(VmgpuError):
    """A shared-memory region could not be created, attached or used."""

    code = "REGION"
    exit_code = 4


class VersionMismatch(RegionError):
    """The region speaks a major ABI version this side does not."""

    code = "VERSION_MISMATCH"
    exit_code = 5


class NativeLibraryMissing(VmgpuError):
    """vmgpu's native parts (libvmgpu_shm, vmgpu-forwarder) are not built or not installed."""

    code = "NATIVE_LIBRARY_MISSING"
    exit_code = 6


class ForwarderError(VmgpuError):
    """A forwarder did not start or stopped unexpectedly."""

    code = "FORWARDER"
    exit_code = 7


class Refused(VmgpuError):
    """Admission refused: not enough of a resource is free.  The message says which GPU,
    which resource, what was asked and what was free."""

    code = "REFUSED"
    exit_code = 8
    grpc_status = "RESOURCE_EXHAUSTED"


class Conflict(VmgpuError):
    """The request contradicts what the ledger holds (a guest admitted with another spec)."""

    code = "CONFLICT"
    exit_code = 9
    grpc_status = "ALREADY_EXISTS"


class GpuError(VmgpuError):
    """The GPU inventory could not be read, or a GPU was lost."""

    code = "GPU"
    exit_code = 10
    grpc_status = "FAILED_PRECONDITION"


class DaemonUnavailable(VmgpuError):
    """vmgpud does not answer on its socket."""

    code = "DAEMON_UNAVAILABLE"
    exit_code = 11


class LibvirtError(VmgpuError):
    """libvirt is missing, unreachable, or refused an operation."""

    code = "LIBVIRT"
    exit_code = 12


class UnsafePath(VmgpuError):
    """A file or directory vmgpu uses is not safe from other local users: a symbolic link,
    someone else's, or open to others.  The message names it and says what to do."""

    code = "UNSAFE_PATH"
    exit_code = 13


class LedgerError(VmgpuError):
    """The admission ledger cannot be read or written (corrupt, read-only, disk full).  The
    message names the file and what to do; nothing half-done was acknowledged."""

    code = "LEDGER"
    exit_code = 14


class SchedulerError(VmgpuError):
    """A GPU's scheduler page cannot be used: there is none yet (no forwarder has run on the
    GPU), the file is not one (too small, another version) or not safe, or a weight or policy
    it cannot take was asked for."""

    code = "SCHEDULER"
    exit_code = 16
    grpc_status = "FAILED_PRECONDITION"


class DaemonRunning(VmgpuError):
    """Another vmgpud already serves this socket (the message names its pid)."""

    code = "DAEMON_RUNNING"
    exit_code = 15


class MpsError(VmgpuError):
    """The host's MPS control daemon (vmgpud --mps) could not be started: its program is missing,
    or it exited; the message says which, and where its log is."""

    code = "MPS"
    exit_code = 17
    grpc_status = "FAILED_PRECONDITION"


BY_CODE = {cls.code: cls for cls in ALL}
# the code table: code -> (exit status, gRPC status, help)
CODES = {cls.code: cls.row() for cls in ALL}
EXIT_CODES = {code: row.exit_code for code, row in CODES.items()}
