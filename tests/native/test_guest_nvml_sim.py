"""The guest's libnvidia-ml.so.1 on the simulated backend: pynvml (unchanged) in a guest process
sees the guest's own slice (its GPUs, its quota as total memory, what its processes hold, its
processes and nobody else's), every function of the real library is there, and one vmgpu does
not serve answers NVML_ERROR_NOT_SUPPORTED."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forwarder import GUEST_LIB, forwarder, hold, run_guest

pytestmark = pytest.mark.native

NVML_DIR = Path(__file__).resolve().parents[2] / "guest_agent" / "nvml"
MIB = 1 << 20

# What a guest process reads through pynvml, as JSON.
PROBE = r"""
import json, sys
import pynvml as n
n.nvmlInit()
out = {"count": n.nvmlDeviceGetCount(), "gpus": []}
for i in range(out["count"]):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    out["gpus"].append({
        "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h), "index": n.nvmlDeviceGetIndex(h),
        "total": m.total, "used": m.used, "free": m.free, "used_v2": m2.used, "total_v2": m2.total,
        "procs": [[p.pid, p.usedGpuMemory] for p in procs],
        "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))),
        "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
        "bus_id": n.nvmlDeviceGetPciInfo(h).busId,
    })
def code(f):
    try:
        f()
        return "ok"
    except n.NVMLError as e:
        return str(e)
h0 = n.nvmlDeviceGetHandleByIndex(0)
out["board_part_number"] = code(lambda: n.nvmlDeviceGetBoardPartNumber(h0))
out["temperature"] = code(lambda: n.nvmlDeviceGetTemperature(h0, 0))
out["bad_index"] = code(lambda: n.nvmlDeviceGetHandleByIndex(out["count"]))
out["names"] = [n.nvmlSystemGetProcessName(p[0]) for p in out["gpus"][0]["procs"]]
n.nvmlShutdown()
out["after_shutdown"] = code(lambda: n.nvmlDeviceGetCount())
print(json.dumps(out))
"""


def probe(region: Path) -> tuple[dict, str]:
    r = run_guest([sys.executable, "-c", PROBE], region)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout), r.stderr


def test_the_guest_library_exports_every_function_of_the_real_one():
    lib = ctypes.CDLL(str(GUEST_LIB / "libnvidia-ml.so.1"))
    names = (NVML_DIR / "driver_exports.txt").read_text().split()
    assert len(names) > 350
    missing = [n for n in names if not hasattr(lib, n)]
    assert missing == []


def test_pynvml_in_a_guest_sees_its_own_slice_and_processes(shm_path, tmp_path, monkeypatch):
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")
    other = tmp_path / "other-region"
    with forwarder(shm_path, mem="1G,2G", extra=["--gpus", "2,0"]), forwarder(other, mem="4G"):
        # another guest holds memory beside it: none of it may show
        stranger = hold(other, 300)
        try:
            assert stranger.stdout.readline().startswith("held")
            idle, _ = probe(shm_path)
            p = hold(shm_path, 256)
            try:
                assert p.stdout.readline().startswith("held")
                busy, err = probe(shm_path)
            finally:
                p.stdin.close()
                p.wait(timeout=30)
            gone, _ = probe(shm_path)
        finally:
            stranger.stdin.close()
            stranger.wait(timeout=30)
    assert idle["count"] == busy["count"] == 2
    g0, g1 = busy["gpus"]
    assert [g0["total"], g1["total"]] == [1 << 30, 2 << 30]  # the quotas, not the cards
    assert g0["total_v2"] == 1 << 30 and g0["index"] == 0 and g1["by_uuid"] == 1
    assert g0["uuid"].startswith("GPU-") and g0["uuid"] != g1["uuid"]
    # the guest's GPUs as its CUDA devices show them: host GPU 2 first (PCI bus 0x42 + ordinal)
    assert g0["bus_id"] == "00000000:44:00.0" and g1["bus_id"] == "00000000:42:00.0"
    # idle: nothing held, no process
    assert idle["gpus"][0]["used"] == 0 and idle["gpus"][0]["procs"] == []
    # the holding process: its 256 MiB (and context) charged to it, under its own pid
    assert len(g0["procs"]) == 1
    pid, held = g0["procs"][0]
    assert pid == p.pid and held >= 256 * MIB
    assert g0["used"] == g0["used_v2"] == held and g0["free"] == g0["total"] - held
    assert busy["names"] == ["hold"]
    assert g1["procs"] == [] and g1["used"] == 0  # it never touched its second GPU
    # the other guest's 300 MiB is nowhere
    assert all(q[1] < 300 * MIB or q[0] == pid for g in busy["gpus"] for q in g["procs"])
    # after it exits its process and memory are gone
    assert gone["gpus"][0]["procs"] == [] and gone["gpus"][0]["used"] == 0
    assert busy["bad_index"] == "Invalid Argument"
    assert busy["after_shutdown"] == "Uninitialized"


def test_a_function_vmgpu_does_not_serve_answers_not_supported_and_says_so_once(shm_path):
    with forwarder(shm_path, mem="1G"):
        out, err = probe(shm_path)
    assert out["board_part_number"] == "Not Supported"
    # the simulated backend has no card readings: not supported, as on a card without a sensor
    assert out["temperature"] == "Not Supported"
    assert err.count("nvmlDeviceGetBoardPartNumber is not supported in a vmgpu guest") == 1


def test_nvml_outside_a_vmgpu_guest_fails_to_initialise_with_a_reason(tmp_path):
    region = tmp_path / "no-such-region"
    r = run_guest(
        [sys.executable, "-c", "import pynvml as n\ntry:\n n.nvmlInit()\nexcept n.NVMLError as e:\n print(e)"], region
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Driver Not Loaded"
    assert "no GPU through vmgpu here" in r.stderr


HOSTILE = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
uuid = (ctypes.c_ubyte * 16)(*b"vmgpu-nvml-live1")
t = ctypes.c_void_p()
assert cu.cuGetExportTable(ctypes.byref(t), uuid) == 0
slots = ctypes.cast(t, ctypes.POINTER(ctypes.c_void_p))
live = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)(slots[1])
buf = ctypes.create_string_buffer(1 << 16)
size = int(sys.argv[1])
print(live(0, buf, size), live(99, buf, size), live(15, buf, size), live(-1, buf, size), live(0, buf, size + 8))
ml = ctypes.CDLL("libnvidia-ml.so.1")
assert ml.nvmlInit_v2() == 0
name = ctypes.create_string_buffer(64)
print(ml.nvmlDeviceGetName(ctypes.c_void_p(0xdeadbeef), name, 64), ml.nvmlDeviceGetName(None, name, 64))
"""


def test_hostile_nvml_queries_are_refused_without_harm(shm_path, tmp_path):
    """A guest asks the host about GPUs it does not have, with a wrong size, and passes NVML
    handles that are not handles: each is refused, and the forwarder (ASan/UBSan) stays clean."""
    with forwarder(shm_path, mem="1G", asan=True) as fwd:
        size = live_size(tmp_path)
        r = run_guest([sys.executable, "-c", HOSTILE, str(size)], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr
        first, second = r.stdout.split("\n")[:2]
        # 0 ok; 101 CUDA_ERROR_INVALID_DEVICE for devices it does not have; 1 for a wrong size
        assert first.split() == ["0", "101", "101", "1", "1"]
        assert second.split() == ["2", "2"]  # NVML_ERROR_INVALID_ARGUMENT
        assert fwd.proc.poll() is None


def live_size(tmp_path: Path) -> int:
    """sizeof(struct vg_nvml_live), as the C compiler lays it out."""
    src = tmp_path / "size.c"
    src.write_text(
        '#include <stdio.h>\n#include "vg_wire.h"\nint main(void){printf("%zu", sizeof(struct vg_nvml_live));}\n'
    )
    exe = tmp_path / "size"
    include = Path(__file__).resolve().parents[2] / "native" / "cuda_api" / "include"
    subprocess.run(["cc", "-o", str(exe), str(src), f"-I{include}"], check=True)
    return int(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


def test_vmgpu_smi_answers_the_nvidia_smi_options_people_script_against(shm_path):
    smi = GUEST_LIB / "vmgpu-smi"
    with forwarder(shm_path, mem="1G"):
        p = hold(shm_path, 128)
        try:
            assert p.stdout.readline().startswith("held")
            table = run_guest([smi], shm_path)
            listing = run_guest([smi, "-L"], shm_path)
            gpu = run_guest(
                [smi, "--query-gpu=index,memory.total,memory.used,temperature.gpu", "--format=csv"], shm_path
            )
            bare = run_guest([smi, "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"], shm_path)
            apps = run_guest([smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv"], shm_path)
            bad = run_guest([smi, "--query-gpu=index,wattage", "--format=csv"], shm_path)
        finally:
            p.stdin.close()
            p.wait(timeout=30)
        after = run_guest([smi, "--query-compute-apps=pid", "--format=csv,noheader"], shm_path)
    for r in (table, listing, gpu, bare, apps, after):
        assert r.returncode == 0, r.stdout + r.stderr
    assert "quota MiB" in table.stdout and f"{p.pid}" in table.stdout and " hold " in table.stdout
    assert listing.stdout.startswith("GPU 0: ") and "(UUID: GPU-" in listing.stdout
    head, row = gpu.stdout.splitlines()
    assert head == "index, memory.total [MiB], memory.used [MiB], temperature.gpu"
    used = int(row.split(", ")[2].split()[0])
    assert row.startswith("0, 1024 MiB, ") and used >= 128 and row.endswith("[N/A]")
    assert bare.stdout.strip() == f"1024, {1024 - used}"
    lines = apps.stdout.splitlines()
    assert lines[0] == "pid, process_name, used_gpu_memory [MiB]"
    assert lines[1:] == [f"{p.pid}, hold, {used} MiB"]
    assert after.stdout == ""  # the process exited: it is gone from the list
    assert bad.returncode == 2 and 'field "wattage" is not a valid field' in bad.stderr


SMI_TABLE = r"""
import ctypes, sys
ml = ctypes.CDLL("libnvidia-ml.so.1")
assert ml.nvmlInit_v2() == 0
t = ctypes.c_void_p(1)
other = (ctypes.c_ubyte * 16)(*range(16))
print("unknown", ml.nvmlInternalGetExportTable(ctypes.byref(t), other), t.value)
smi = (ctypes.c_ubyte * 16)(*bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4"))
assert ml.nvmlInternalGetExportTable(ctypes.byref(t), smi) == 0
slots = ctypes.cast(t, ctypes.POINTER(ctypes.c_void_p))
print("size", slots[0])
bus = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_uint)(slots[81])
buf = ctypes.create_string_buffer(34)
print("bus", bus(0, buf, 34), buf.value.decode(), bus(99, buf, 34), bus(0, buf, 4))
procs = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p)(slots[213])
h = ctypes.c_void_p()
assert ml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
n = ctypes.c_uint(0)
print("none-room", procs(h, ctypes.byref(n), None), n.value)
n = ctypes.c_uint(500)
entries = ctypes.create_string_buffer(500 * 4128)
r = procs(h, ctypes.byref(n), entries)
pid = int.from_bytes(entries.raw[0:4], "little")
mem = int.from_bytes(entries.raw[8:16], "little")
name = entries.raw[32:64].split(b"\0")[0].decode()
print("procs", r, n.value, pid, mem, name)
print("bad", procs(ctypes.c_void_p(0x1000), ctypes.byref(n), entries), procs(h, None, entries))
"""


def test_the_table_nvidia_smi_asks_for_gives_the_guests_own_answers(shm_path):
    """nvidia-smi needs NVML's table c4fe3e6c…: its PCI-address slot (81) and its process-list slot
    (213, entries of 4128 bytes: pid, memory, name at 32) answer with the guest's own GPU and
    processes; hostile arguments (a handle that is not one, no count, no room, a device it does
    not have, another table's id) are refused."""
    with forwarder(shm_path, mem="1G"):
        p = hold(shm_path, 64)
        try:
            assert p.stdout.readline().startswith("held")
            r = run_guest([sys.executable, "-c", SMI_TABLE], shm_path)
        finally:
            p.stdin.close()
            p.wait(timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out["unknown"] == "3 None"  # NVML_ERROR_NOT_SUPPORTED, and no table
    assert out["size"] == str(270 * 8)
    assert out["bus"] == "0 0000:42:00.0 2 7"  # then INVALID_ARGUMENT, INSUFFICIENT_SIZE
    assert out["none-room"] == "7 1"  # INSUFFICIENT_SIZE, and how many there are
    code, n, pid, mem, name = out["procs"].split()
    assert (code, n, int(pid), name) == ("0", "1", p.pid, "hold") and int(mem) >= 64 * MIB
    assert out["bad"] == "2 2"


def test_the_vm_guest_agent_installs_the_guest_libraries_never_through_a_link(tmp_path):
    """vmgpu-guest-agent install puts libcuda.so.1, libnvidia-ml.so.1 and vmgpu-smi in place; a
    symbolic link planted at one of the names is replaced, and what it pointed at is untouched."""
    prefix = tmp_path / "usr"
    (prefix / "bin").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (prefix / "bin" / "vmgpu-smi").symlink_to(victim)
    r = subprocess.run(
        [str(GUEST_LIB / "vmgpu-guest-agent"), "install", "--prefix", str(prefix)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    lib = prefix / "lib" / "x86_64-linux-gnu"
    for name, where in (("libcuda.so.1", lib), ("libnvidia-ml.so.1", lib), ("vmgpu-smi", prefix / "bin")):
        assert not (where / name).is_symlink()
        assert (where / name).read_bytes() == (GUEST_LIB / name).read_bytes(), name
    assert victim.read_text() == "keep me\n"
    assert oct((prefix / "bin" / "vmgpu-smi").stat().st_mode & 0o777) == "0o755"
    assert sorted(p.name for p in lib.iterdir()) == ["libcuda.so.1", "libnvidia-ml.so.1"]  # no temporary left
    bad = subprocess.run([str(GUEST_LIB / "vmgpu-guest-agent"), "install", "--prefix", "relative"], capture_output=True)
    assert bad.returncode == 2


def test_before_nvml_init_every_function_answers_uninitialized(shm_path):
    """As the real library: served or not, a device function called before nvmlInit answers
    NVML_ERROR_UNINITIALIZED (1), and nothing is logged for it."""
    script = (
        "import ctypes\nml = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "n = ctypes.c_uint()\nbuf = ctypes.create_string_buffer(64)\n"
        "print(ml.nvmlDeviceGetCount_v2(ctypes.byref(n)), ml.nvmlDeviceGetBoardPartNumber(None, buf, 64))"
    )
    with forwarder(shm_path, mem="1G"):
        r = run_guest([sys.executable, "-c", script], shm_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"]
    assert "not supported" not in r.stderr
