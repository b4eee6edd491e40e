"""A VM through an installed vmgpu, the checkout out of reach: the wheel installed into a virtual
environment outside the checkout (tests/libvirt/installed.py, built once per session), its
`vmgpu setup` writing vmgpud's unit and the qemu hook into a test root, vmgpud started as that unit
starts it and libvirtd running that hook, both where an empty tmpfs lies over the checkout.  A TCG
guest given a share starts, its unchanged CUDA program (the wheel's driver-API program, with the
wheel's guest libcuda.so.1 and agent) computes on the simulated backend, and the forwarder and its
worker run the wheel's programs.  And `vmgpu demo` of the installed package runs the wheel's own
programs (vmgpu/_native/demo/) with the checkout out of reach.

Needs what tests/libvirt/test_vm_e2e.py needs (root, libvirtd, QEMU, a mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.forwarder import wait_for
from tests.libvirt import guest
from tests.libvirt.installed import HOOK, REPO, assert_serves_installed, installed, need_namespace
from vmgpu import spec
from vmgpu.client import Client
from vmgpu.virt import domain

pytestmark = pytest.mark.libvirt
HERE = Path(__file__).resolve().parent
INVENTORY = '[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-0000000000e3"\nname = "inst"\nmemory = "1G"\n'
NAME = "vmgpu-e2e-installed"
# hold keeps a worker of the forwarder busy for a while (until sleep ends its stdin): the test
# looks at that worker meanwhile
SCRIPT = """
vmgpu-guest-agent setup --gid 0 || echo "VMGPU-E2E agent failed"
/bin/drv_api /vadd.ptx 24 > /tmp/o 2>&1; echo "VMGPU-E2E drv_api rc=$?"; cat /tmp/o
sleep 10 | /bin/hold 64; echo "VMGPU-E2E hold rc=$?"
"""


@pytest.fixture(scope="module")
def inst(tmp_path_factory):
    """The installed wheel, where a mount namespace can hide the checkout from what runs it."""
    need_namespace()
    return installed(tmp_path_factory)


def test_the_installed_demo_runs_the_wheels_own_programs_with_the_checkout_out_of_reach(inst):
    r = inst.vmgpu("demo", "--backend", "sim", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    # `make wheel` builds with nvcc (the toolkit's or NVIDIA's wheel): the nvcc-built vector add is there
    assert [p["program"] for p in d["programs"]] == ["drv_api vadd.ptx 64", f"vecadd_ptx {1 << 22}"], d
    assert all(p["ok"] for p in d["programs"]) and d["skipped"] == [] and d["simulated"], d
    assert (inst.native / "demo" / "vecadd_ptx").is_file()


@pytest.fixture(scope="module")
def host(inst, tmp_path_factory):
    if not Path("/usr/sbin/libvirtd").exists():
        pytest.skip("libvirt-daemon is not installed (.ci/run installs it)")
    import libvirt

    tmp = tmp_path_factory.mktemp("installed-vm")
    root, daemon = inst.host(tmp, INVENTORY)
    # libvirtd's /etc/libvirt is the test root's, where `vmgpu setup` put the hook; the checkout hidden
    env = {**os.environ, "VMGPU_LIBVIRT_ETC": str(root / "etc" / "libvirt"), "VMGPU_LIBVIRT_HIDE": str(REPO)}
    conn = client = None
    try:
        subprocess.run([str(HERE / "libvirtd.sh"), "up"], check=True, env=env)
        libvirt.registerErrorHandler(lambda *_: None, None)
        conn = libvirt.open("qemu:///system")
        client = Client(str(tmp / "run" / "vmgpud.sock"))
        yield conn, client, tmp, inst, daemon
    finally:
        if client:
            client.close()
        if conn:
            conn.close()
        subprocess.run([str(HERE / "libvirtd.sh"), "down"], check=False)
        daemon.terminate()
        daemon.wait()


def test_a_vm_computes_through_the_installed_hook_vmgpud_and_forwarder_with_the_checkout_out_of_reach(host):
    conn, client, tmp, inst, daemon = host
    assert (tmp / "root" / HOOK).read_text().startswith(f"#!{inst.python}\n")
    kernel = tmp / "vmlinuz"  # QEMU runs where the checkout is hidden: the kernel must be outside it
    shutil.copy2(guest.kernel(), kernel)
    progs = {
        "drv_api": inst.native / "demo" / "drv_api",
        "hold": guest.NATIVE / "hold",  # a test program, not part of what is installed
        "vmgpu-guest-agent": inst.native / "guest" / "vmgpu-guest-agent",
        "vmgpu-smi": inst.native / "guest" / "vmgpu-smi",
    }
    initrd = guest.build_initramfs(
        tmp / "run.cpio", progs, {"/vadd.ptx": inst.native / "demo" / "vadd.ptx"}, SCRIPT, native=inst.native
    )
    console = tmp / f"{NAME}.console"
    xml = guest.domain_xml(NAME, initrd, console, kernel_path=kernel)
    conn.defineXML(domain.attach(xml, spec.parse("gpu=0,mem=256M,weight=50"), 16))
    dom = conn.lookupByName(NAME)
    try:
        dom.create()  # the installed hook admits it through the installed vmgpud, which starts its forwarder
        assert [(s.guest, s.mem_mib) for s in client.status().slices] == [(NAME, 256)]
        assert wait_for(lambda: "held" in console.read_text(errors="replace"), timeout=240), console.read_text()
        assert_serves_installed(client, daemon.pid, inst)
        assert wait_for(lambda: not dom.isActive(), timeout=240), "the guest did not power off"
    finally:
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    out = console.read_text(errors="replace")
    print(out)
    for want in (
        "VMGPU-E2E drv_api rc=0",
        "PASSED: 0 unexpected",
        "vadd result",
        "SIMULATED backend",
        "VMGPU-E2E hold rc=0",
        "VMGPU-E2E done",
    ):
        assert want in out, f"'{want}' not on the guest's console:\n{out}"
    assert "UNEXPECTED" not in out and "WRONG" not in out and "agent failed" not in out
    # the installed release hook gave the share back and removed the region
    assert wait_for(lambda: not client.status().slices and not client.status().forwarders, timeout=30)
    assert not Path(f"/dev/shm/vmgpu-{NAME}").exists()
