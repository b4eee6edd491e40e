"""The host's GPUs.  The only module that imports pynvml (nvidia-ml-py).

Each field is read on its own, so a field the driver does not support does not lose the
device; a GPU that is lost is an error, never a None.  Hosts without NVML (CI, planning)
declare their GPUs in a TOML file:

    [[gpu]]
    index = 0
    uuid = "GPU-2334bcfe-b020-635c-eae9-8d9e7483b949"
    name = "NVIDIA H100 80GB HBM3"
    memory = "80G"            # or a number of MiB
    pci_bus_id = "00000000:00:06.0"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from vmgpu.errors import GpuError, InvalidArgument
from vmgpu.spec import SpecError, _mem


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str = ""


def declared(path: str | Path) -> list[Gpu]:
    """GPUs from a declared inventory file."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise InvalidArgument(f"inventory {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgument(f"inventory {path}: {e}") from None
    gpus = []
    for i, g in enumerate(doc.get("gpu", []), 1):
        where = f"inventory {path}, gpu {i}"
        for key in ("index", "uuid", "memory"):
            if key not in g:
                raise InvalidArgument(f"{where}: {key} is missing")
        try:
            mib, frac = _mem(str(g["memory"]), where)
        except SpecError as e:
            raise InvalidArgument(e.message) from None
        if frac is not None:
            raise InvalidArgument(f"{where}: memory must be a size, not a percentage")
        gpus.append(Gpu(int(g["index"]), str(g["uuid"]), str(g.get("name", "")), mib, str(g.get("pci_bus_id", ""))))
    _check(gpus, str(path))
    return gpus


def _check(gpus: list[Gpu], source: str) -> None:
    if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
        raise InvalidArgument(f"{source}: GPU indices and UUIDs must be unique")


def nvml() -> list[Gpu]:
    """GPUs as NVML reports them."""
    try:
        import pynvml
    except ImportError:
        raise GpuError("nvidia-ml-py is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise GpuError(f"NVML is not available: {e}") from None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)

            def field(fn, default, h=h, i=i):
                try:
                    return fn(h)
                except pynvml.NVMLError_GpuIsLost:
                    raise GpuError(f"GPU {i} is lost (fallen off the bus); it needs a reset") from None
                except pynvml.NVMLError:
                    return default  # not supported on this device: keep the device

            uuid = field(pynvml.nvmlDeviceGetUUID, "")
            mem = field(pynvml.nvmlDeviceGetMemoryInfo, None)
            if not uuid or mem is None:
                raise GpuError(f"GPU {i}: NVML gives no UUID or memory size")
            pci = field(pynvml.nvmlDeviceGetPciInfo, None)
            bus = pci.busId if pci is not None else ""
            gpus.append(
                Gpu(
                    index=i,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                    name=_text(field(pynvml.nvmlDeviceGetName, "")),
                    memory_mib=int(mem.total) >> 20,
                    pci_bus_id=_text(bus),
                )
            )
        _check(gpus, "NVML")
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def inventory(declared_path: str | Path | None = None) -> list[Gpu]:
    """The declared inventory if a file is given, else NVML."""
    return declared(declared_path) if declared_path else nvml()
