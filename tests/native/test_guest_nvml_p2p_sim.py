"""The guest NVML's view of how its GPUs reach each other, on the simulated backend (its own NVML,
host_forwarder/sim/nvml.c, wired by VMGPU_SIM_NVLINK / VMGPU_SIM_NVSWITCH): pynvml (unchanged)
in a guest process gets what NCCL's topology detection asks (P2P status between every pair of
its GPUs, a GPU with itself included; each NvLink's state, capabilities, far end and fields),
answered by the host for the guest's own GPUs only.  A link to a GPU that is not the guest's
does not name it, and a handle that is not one of the guest's GPUs is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.forwarder import forwarder, run_guest

pytestmark = pytest.mark.native

# What a guest process reads through pynvml, as JSON: each answer or the error's text.
PROBE = r"""
import ctypes, json
import pynvml as n
n.nvmlInit()
def get(f):
    try:
        v = f()
    except n.NVMLError as e:
        return str(e)
    if isinstance(v, n.nvmlPciInfo_t):
        return {"bus_id": v.busId.decode() if isinstance(v.busId, bytes) else v.busId, "bus": v.bus}
    return v
count = n.nvmlDeviceGetCount()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
out = {"count": count, "bus_ids": [n.nvmlDeviceGetPciInfo(h).busId for h in hs], "p2p": {}, "links": []}
for a in range(count):
    for b in range(count):
        out["p2p"][f"{a},{b}"] = [get(lambda: n.nvmlDeviceGetP2PStatus(hs[a], hs[b], c)) for c in range(6)]
for h in hs:
    links = []
    for l in (0, 3, 4, 17, 18):
        links.append({
            "link": l,
            "state": get(lambda: n.nvmlDeviceGetNvLinkState(h, l)),
            "version": get(lambda: n.nvmlDeviceGetNvLinkVersion(h, l)),
            "p2p_cap": get(lambda: n.nvmlDeviceGetNvLinkCapability(h, l, n.NVML_NVLINK_CAP_P2P_SUPPORTED)),
            "sysmem_cap": get(lambda: n.nvmlDeviceGetNvLinkCapability(h, l, n.NVML_NVLINK_CAP_SYSMEM_ACCESS)),
            "remote": get(lambda: n.nvmlDeviceGetNvLinkRemotePciInfo(h, l)),
            "remote_type": get(lambda: n.nvmlDeviceGetNvLinkRemoteDeviceType(h, l)),
        })
    fv = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_NVLINK_LINK_COUNT, (n.NVML_FI_DEV_NVLINK_GET_STATE, 0),
                                        (n.NVML_FI_DEV_NVLINK_GET_STATE, 4), (n.NVML_FI_DEV_NVLINK_GET_VERSION, 0),
                                        n.NVML_FI_DEV_C2C_LINK_COUNT])
    links.append({"fields": [[v.nvmlReturn, v.value.uiVal if v.nvmlReturn == 0 else None] for v in fv]})
    out["links"].append(links)
# handles that are not one of the guest's GPUs, through the C ABI: forged, and a pointer to
# memory of this process shaped like a device
ml = ctypes.CDLL("libnvidia-ml.so.1")
h0 = ctypes.c_void_p()
assert ml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h0)) == 0
fake = ctypes.create_string_buffer(4096)
st, pci, fields = ctypes.c_int(), ctypes.create_string_buffer(128), (ctypes.c_char * 64)()
out["forged"] = [
    ml.nvmlDeviceGetP2PStatus(h0, ctypes.c_void_p(h0.value + 1), 0, ctypes.byref(st)),
    ml.nvmlDeviceGetP2PStatus(fake, h0, 0, ctypes.byref(st)),
    ml.nvmlDeviceGetP2PStatus(h0, h0, 6, ctypes.byref(st)),
    ml.nvmlDeviceGetNvLinkState(fake, 0, ctypes.byref(st)),
    ml.nvmlDeviceGetNvLinkRemotePciInfo_v2(ctypes.c_void_p(1), 0, pci),
    ml.nvmlDeviceGetNvLinkCapability(fake, 0, 0, ctypes.byref(st)),
    ml.nvmlDeviceGetFieldValues(fake, 1, fields),
]
# NCCL asks for the unversioned name: the same answer as _v2's
pci2 = ctypes.create_string_buffer(128)
out["v1"] = [ml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 0, pci), ml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h0, 0, pci2),
             pci.raw == pci2.raw]
# every address near the guest's first GPU's handle, which holds the handles of GPUs it does not
# have (a guest given one GPU of two: the other's would be the next one)
near = [ctypes.c_void_p(h0.value + k) for k in range(1, 8192)]
out["near"] = sorted({ml.nvmlDeviceGetP2PStatus(h0, h, 0, ctypes.byref(st)) for h in near}
                     | {ml.nvmlDeviceGetNvLinkState(h, 0, ctypes.byref(st)) for h in near})
out["other_index"] = get(lambda: n.nvmlDeviceGetHandleByIndex(count))
print(json.dumps(out))
"""

OK, CHIPSET, P2P_NOT_SUPPORTED, P2P_UNKNOWN = 0, 1, 5, 6
INVALID = 2  # NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


def probe(region: Path) -> tuple[dict, str]:
    r = run_guest([sys.executable, "-c", PROBE], region)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout), r.stderr


def test_a_two_gpu_guest_sees_p2p_and_the_nvlinks_between_its_gpus(shm_path, monkeypatch):
    """What NCCL asks at its start answers: P2P read and write for every pair (itself included),
    and each NvLink of GPU 0 leading to GPU 1 as the guest knows GPU 1; through the ASan
    forwarder, whose log stays clean."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    monkeypatch.setenv("VMGPU_SIM_NVLINK", "4")
    with forwarder(shm_path, mem="1G,1G", extra=["--gpus", "1,0"], asan=True):
        out, err = probe(shm_path)
    assert out["count"] == 2
    bus0, bus1 = out["bus_ids"]
    assert (bus0, bus1) == ("00000000:43:00.0", "00000000:42:00.0")  # host GPU 1 first
    # every pair, every caps index: read, write, NvLink, atomics, PCI over the link; unknown
    for pair in ("0,1", "1,0", "0,0", "1,1"):
        assert out["p2p"][pair] == [OK, OK, OK, OK, OK, P2P_UNKNOWN], pair
    for g, peer_bus in ((0, bus1), (1, bus0)):
        by_link = {x["link"]: x for x in out["links"][g][:-1]}
        for link in (0, 3):
            x = by_link[link]
            assert x["state"] == 1 and x["version"] == 6 and x["p2p_cap"] == 1 and x["sysmem_cap"] == 0
            assert x["remote"] == {"bus_id": peer_bus, "bus": int(peer_bus.split(":")[1], 16)}
            assert x["remote_type"] == 0  # NVML_NVLINK_DEVICE_TYPE_GPU
        for link in (4, 17):  # four links joined: the others are not there
            assert by_link[link]["state"] == by_link[link]["remote"] == by_link[link]["p2p_cap"] == "Not Supported"
        assert by_link[18]["state"] == by_link[18]["remote"] == "Invalid Argument"  # NVML_NVLINK_MAX_LINKS
        count, state0, state4, version0, c2c = out["links"][g][-1]["fields"]
        assert count == [0, 4] and state0 == [0, 1] and version0 == [0, 6]
        assert state4 == [NOT_SUPPORTED, None] and c2c == [NOT_SUPPORTED, None]
    assert out["forged"] == [INVALID] * 7
    assert out["v1"] == [0, 0, True]
    assert out["near"] == [0, INVALID]  # GPU 1's handle, and nothing else, is one
    assert out["other_index"] == "Invalid Argument"
    assert "nvmlDeviceGetP2PStatus is not supported" not in err


def test_gpus_without_nvlink_or_a_peer_path_answer_as_pcie_cards_do(shm_path, monkeypatch):
    """No NvLink: every link is NVML_ERROR_NOT_SUPPORTED (NCCL skips it) while P2P status still
    answers, saying what the PCIe path allows: nothing, here."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    monkeypatch.setenv("VMGPU_SIM_NO_PEER_PATH", "1")
    monkeypatch.delenv("VMGPU_SIM_NVLINK", raising=False)
    with forwarder(shm_path, mem="1G,1G", extra=["--gpus", "0,1"]):
        out, _ = probe(shm_path)
    assert out["p2p"]["0,1"] == [CHIPSET, CHIPSET, P2P_NOT_SUPPORTED, CHIPSET, CHIPSET, P2P_UNKNOWN]
    assert out["p2p"]["1,1"][:2] == [OK, OK]
    for x in out["links"][0][:-1]:
        expected = "Invalid Argument" if x["link"] == 18 else "Not Supported"
        assert x["state"] == x["remote"] == x["remote_type"] == x["p2p_cap"] == expected
    assert out["links"][0][-1]["fields"][0] == [NOT_SUPPORTED, None]


def test_a_guest_given_one_gpu_of_two_learns_nothing_of_the_other(shm_path, monkeypatch):
    """Host GPU 1's NvLinks lead to host GPU 0, which is not the guest's: the links are its own
    GPU's (their state shows) but their far end is not named (NVML_ERROR_NOT_SUPPORTED: not a
    zeroed address, which NCCL would take for an NVSwitch), and nothing the guest reads carries
    GPU 0's address (PCI bus 0x42) or its handle."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    monkeypatch.setenv("VMGPU_SIM_NVLINK", "4")
    with forwarder(shm_path, mem="1G", extra=["--gpus", "1"], asan=True):
        out, _ = probe(shm_path)
    assert out["count"] == 1 and out["bus_ids"] == ["00000000:43:00.0"]
    assert out["p2p"] == {"0,0": [OK, OK, OK, OK, OK, P2P_UNKNOWN]}
    link0 = out["links"][0][0]
    assert link0["state"] == 1 and link0["p2p_cap"] == 1
    assert link0["remote"] == link0["remote_type"] == "Not Supported"
    assert "42:00" not in json.dumps(out) and ":42" not in json.dumps(out)
    assert out["forged"] == [INVALID] * 7
    assert out["v1"] == [NOT_SUPPORTED, NOT_SUPPORTED, True]
    assert out["near"] == [INVALID]  # where host GPU 0's handle would be is no handle
    assert out["other_index"] == "Invalid Argument"


def test_links_to_an_nvswitch_are_shown_as_a_switch_without_its_host_address(shm_path, monkeypatch):
    """On an HGX-like board every link leads to an NVSwitch: the guest is told a switch is there
    (NCCL then routes its GPUs over NvLink) and given the address NCCL takes for a switch it
    cannot see, never the host's (an empty one made NCCL look it up in the guest's sysfs)."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")
    monkeypatch.setenv("VMGPU_SIM_NVSWITCH", "18")
    with forwarder(shm_path, mem="1G,1G", extra=["--gpus", "0,2"]):
        out, _ = probe(shm_path)
        attrs = run_guest([sys.executable, "-c", ATTRS], shm_path)
    assert out["p2p"]["0,1"][2] == OK  # NvLink between its GPUs, through the switch
    by_link = {x["link"]: x for x in out["links"][1][:-1]}
    for link in (0, 17):
        assert by_link[link]["state"] == 1
        assert by_link[link]["remote"] == {"bus_id": "fffffff:ffff:ff", "bus": 0}
        assert by_link[link]["remote_type"] == 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert out["links"][1][-1]["fields"][0] == [0, 18]
    # the board offers multicast and fabric handles; vmgpu serves neither, so the guest is told
    # what a GPU without them says, and NCCL and XLA take their fallbacks
    assert attrs.returncode == 0, attrs.stdout + attrs.stderr
    out = json.loads(attrs.stdout)
    assert {k: out[k] for k in ("multicast", "fabric")} == {"multicast": 0, "fabric": 0}


def test_multicast_calls_answer_as_on_a_gpu_without_multicast_on_a_board_that_has_it(shm_path, monkeypatch):
    """The board offers multicast objects; guests are told their GPU has none, and the cuMulticast*
    calls answer so, in the guest: not initialised before cuInit, their argument checks
    (CUDA_ERROR_INVALID_VALUE, 1), then CUDA_ERROR_NOT_SUPPORTED (801), said once.  (Before, they
    fell to the unserved stub: 801 whatever the arguments, and `is not supported` in the log.)"""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    monkeypatch.setenv("VMGPU_SIM_NVSWITCH", "18")
    with forwarder(shm_path, mem="1G"):
        attrs = run_guest([sys.executable, "-c", ATTRS], shm_path)
    assert attrs.returncode == 0, attrs.stdout + attrs.stderr
    out = json.loads(attrs.stdout)
    assert out["calls"] == {
        "before_init": 3,  # CUDA_ERROR_NOT_INITIALIZED, before the argument checks
        "granularity": 801,
        "granularity_null": 1,
        "granularity_bad_option": 1,
        "create": 801,
        "create_null": 1,
        "add_device": 801,
        "bind_mem": 801,
        "bind_addr": 801,
        "unbind": 801,
    }
    assert attrs.stderr.count("multicast objects are not offered to guests") == 1, attrs.stderr
    assert "is not supported" not in attrs.stderr, attrs.stderr


ATTRS = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
gran0 = ctypes.c_size_t(0)
before_init = cu.cuMulticastGetGranularity(ctypes.byref(gran0), None, 0)
assert cu.cuInit(0) == 0
v = ctypes.c_int(-1)
out = {}
for name, attr in (("multicast", 132), ("fabric", 128)):
    assert cu.cuDeviceGetAttribute(ctypes.byref(v), attr, 0) == 0
    out[name] = v.value


class Prop(ctypes.Structure):  # CUmulticastObjectProp
    _fields_ = [("numDevices", ctypes.c_uint), ("size", ctypes.c_size_t),
                ("handleTypes", ctypes.c_ulonglong), ("flags", ctypes.c_ulonglong)]


prop, gran, h = Prop(2, 2 << 20, 0, 0), ctypes.c_size_t(0), ctypes.c_ulonglong(0)
u64, sz = ctypes.c_ulonglong, ctypes.c_size_t
out["calls"] = {
    "before_init": before_init,
    "granularity": cu.cuMulticastGetGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
    "granularity_null": cu.cuMulticastGetGranularity(None, ctypes.byref(prop), 1),
    "granularity_bad_option": cu.cuMulticastGetGranularity(ctypes.byref(gran), ctypes.byref(prop), 7),
    "create": cu.cuMulticastCreate(ctypes.byref(h), ctypes.byref(prop)),
    "create_null": cu.cuMulticastCreate(ctypes.byref(h), None),
    "add_device": cu.cuMulticastAddDevice(u64(1), 0),
    "bind_mem": cu.cuMulticastBindMem(u64(1), sz(0), u64(2), sz(0), sz(2 << 20), u64(0)),
    "bind_addr": cu.cuMulticastBindAddr(u64(1), sz(0), u64(1 << 40), sz(2 << 20), u64(0)),
    "unbind": cu.cuMulticastUnbind(u64(1), 0, sz(0), sz(2 << 20)),
}
print(json.dumps(out))
"""
