"""GPU inventory: a declared file for hosts without NVML, and NVML read field by field
(exercised here against a stand-in pynvml module with the real one's error classes)."""

import sys
import types

import pytest

from vmgpu import gpu
from vmgpu.errors import GpuError, InvalidArgument


def test_declared_inventory(tmp_path):
    f = tmp_path / "inv.toml"
    f.write_text(
        '[[gpu]]\nindex = 0\nuuid = "GPU-a"\nname = "A"\nmemory = "32G"\n'
        '[[gpu]]\nindex = 1\nuuid = "GPU-b"\nmemory = 16384\npci_bus_id = "0000:01:00.0"\n'
    )
    assert gpu.declared(f) == [gpu.Gpu(0, "GPU-a", "A", 32768), gpu.Gpu(1, "GPU-b", "", 16384, "0000:01:00.0")]


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[gpu]]\nuuid = "GPU-a"\nmemory = "1G"\n', "gpu 1: index is missing"),
        ('[[gpu]]\nindex = 0\nuuid = "GPU-a"\nmemory = "50%"\n', "memory must be a size"),
        (
            '[[gpu]]\nindex = 0\nuuid = "GPU-a"\nmemory = "1G"\n[[gpu]]\nindex = 0\nuuid = "GPU-b"\nmemory = "1G"\n',
            "indices and UUIDs must be unique",
        ),
        ("[[gpu]\n", "inventory"),
    ],
)
def test_declared_inventory_errors(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(InvalidArgument, match=message):
        gpu.declared(f)


def _fake_pynvml(monkeypatch):
    """A stand-in for pynvml; fill m.devices: index -> dict of field -> value or exception."""
    m = types.ModuleType("pynvml")
    devices = m.devices = {}

    class NVMLError(Exception):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    m.NVMLError, m.NVMLError_GpuIsLost, m.NVMLError_NotSupported = (
        NVMLError,
        NVMLError_GpuIsLost,
        NVMLError_NotSupported,
    )
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: i

    def getter(name):
        def fn(h):
            v = devices[h][name]
            if isinstance(v, type) and issubclass(v, Exception):
                raise v()
            return v

        return fn

    for name in ("UUID", "Name", "MemoryInfo", "PciInfo"):
        setattr(m, f"nvmlDeviceGet{name}", getter(name))
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return m


def _dev(**over):
    d = {
        "UUID": "GPU-x",
        "Name": b"NVIDIA H100",
        "MemoryInfo": types.SimpleNamespace(total=80 << 30),
        "PciInfo": types.SimpleNamespace(busId=b"00000000:00:06.0"),
    }
    d.update(over)
    return d


def test_nvml_reads_each_field_and_keeps_a_device_with_an_unsupported_one(monkeypatch):
    m = _fake_pynvml(monkeypatch)
    m.devices.update({0: _dev(), 1: _dev(UUID="GPU-y", PciInfo=m.NVMLError_NotSupported)})
    got = gpu.nvml()
    assert got[0] == gpu.Gpu(0, "GPU-x", "NVIDIA H100", 81920, "00000000:00:06.0")
    assert got[1] == gpu.Gpu(1, "GPU-y", "NVIDIA H100", 81920, "")


def test_nvml_lost_gpu_is_an_error(monkeypatch):
    m = _fake_pynvml(monkeypatch)
    m.devices[0] = _dev(MemoryInfo=m.NVMLError_GpuIsLost)
    with pytest.raises(GpuError, match="GPU 0 is lost"):
        gpu.nvml()


def test_cli_gpus_from_a_declared_inventory(tmp_path):
    from click.testing import CliRunner

    from vmgpu.cli.main import cli

    f = tmp_path / "inv.toml"
    f.write_text('[[gpu]]\nindex = 0\nuuid = "GPU-a"\nname = "A"\nmemory = "32G"\n')
    r = CliRunner().invoke(cli, ["gpus", "--inventory", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert '"memory_mib": 32768' in r.output
    bad = CliRunner().invoke(cli, ["gpus", "--inventory", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2 and "INVALID_ARGUMENT" in bad.output
