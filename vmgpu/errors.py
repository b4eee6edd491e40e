"""One error tree for vmgpu.  Every error has a stable code; the CLI's exit
code (and later the gRPC status and the hook's message) derive from it here."""

from __future__ import annotations


class VmgpuError(Exception):
    """Base of every vmgpu error.  `code` is stable and documented."""

    code = "VMGPU_ERROR"
    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(VmgpuError):
    code = "INVALID_ARGUMENT"
    exit_code = 2


class SpecError(InvalidArgument):
    """A share spec that cannot be used; the message names the slice and the field."""

    code = "INVALID_SPEC"


class NotFound(VmgpuError):
    code = "NOT_FOUND"
    exit_code = 3


class RegionError(VmgpuError):
    """A shared-memory region could not be created, attached or used."""

    code = "REGION"
    exit_code = 4


class VersionMismatch(RegionError):
    """The region speaks a major ABI version this side does not."""

    code = "VERSION_MISMATCH"
    exit_code = 5


class NativeLibraryMissing(VmgpuError):
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


class Conflict(VmgpuError):
    """The request contradicts what the ledger holds (a guest admitted with another spec)."""

    code = "CONFLICT"
    exit_code = 9


class GpuError(VmgpuError):
    """The GPU inventory could not be read, or a GPU was lost."""

    code = "GPU"
    exit_code = 10


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


class DaemonRunning(VmgpuError):
    """Another vmgpud already serves this socket (the message names its pid)."""

    code = "DAEMON_RUNNING"
    exit_code = 15


ALL = (
    VmgpuError,
    InvalidArgument,
    SpecError,
    NotFound,
    RegionError,
    VersionMismatch,
    NativeLibraryMissing,
    ForwarderError,
    Refused,
    Conflict,
    GpuError,
    DaemonUnavailable,
    LibvirtError,
    UnsafePath,
    LedgerError,
    DaemonRunning,
)
BY_CODE = {cls.code: cls for cls in ALL}

# code -> exit status, for documentation and tests
EXIT_CODES = {cls.code: cls.exit_code for cls in ALL}
