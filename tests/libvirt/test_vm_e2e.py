"""End to end with a real libvirtd and a real QEMU (TCG) guest: a domain given a GPU share
with `vmgpu vm attach`, started with libvirt, its qemu hook admitting it through vmgpud and
starting its forwarder (simulated backend: no GPU here), the guest agent finding the ivshmem
region, and unchanged CUDA programs in the guest running their memory and error paths
through the host forwarder, as an unprivileged user.  Over-commit is refused with the reason;
the share is released after the guest shuts down and after `virsh destroy`.

Needs root and Debian's libvirt-daemon, libvirt-daemon-driver-qemu, qemu-system-x86 and
busybox-static (.ci/run installs them); starts libvirtd by hand (tests/libvirt/libvirtd.sh).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.forwarder import start_daemon, wait_for
from tests.libvirt import guest
from vmgpu.client import Client
from vmgpu.virt import hook

pytestmark = pytest.mark.libvirt
HERE = Path(__file__).resolve().parent
HOOKS = Path("/etc/libvirt/hooks")
INVENTORY = '[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-0000000000e2"\nname = "e2e"\nmemory = "1G"\n'
RUN = "/bin/runas 1000 1000"
SCRIPT = f"""
mkdir -p /etc
vmgpu-guest-agent setup || echo "VMGPU-E2E agent failed"
set -- $(ls -lnL /dev/vmgpu/region)
echo "VMGPU-E2E default $1 gid $4 $(grep '^vmgpu:' /etc/group)"
{RUN} /bin/hold 0 </dev/null > /dev/null 2>&1; echo "VMGPU-E2E default-other rc=$?"
vmgpu-guest-agent setup --mode 0660 --gid 1000 || echo "VMGPU-E2E agent failed"
vmgpu-guest-agent reap &
{RUN} /bin/drv_api /vadd.ptx 24 > /tmp/o 2>&1; echo "VMGPU-E2E drv_api rc=$?"; cat /tmp/o
{RUN} /bin/hold 0 </dev/null; echo "VMGPU-E2E hold0 rc=$?"
{RUN} /bin/hold 300 </dev/null; echo "VMGPU-E2E hold300 rc=$?"
{RUN} /bin/vmgpu-smi
"""


def _need(condition: bool, why: str):
    if not condition:
        pytest.skip(why)


def _tree(d: Path) -> dict:
    """What a directory holds: path -> (mode, content), links as their target."""
    out = {}
    for p in sorted(d.rglob("*")) if d.exists() else ():
        st = p.lstat()
        out[str(p)] = (st.st_mode, os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    _need(os.geteuid() == 0, "needs root (libvirtd)")
    _need(Path("/usr/sbin/libvirtd").exists(), "libvirt-daemon is not installed (.ci/run installs it)")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    _need(probe.returncode == 0, f"needs a mount namespace for libvirtd's own hooks directory: {probe.stderr.strip()}")
    import libvirt

    system_hooks = _tree(HOOKS)
    tmp = tmp_path_factory.mktemp("e2e")
    inv = tmp / "inventory.toml"
    inv.write_text(INVENTORY)
    sock = tmp / "run" / "vmgpud.sock"
    daemon = start_daemon(sock, tmp / "ledger.db", inv)
    # the hook goes into the test libvirtd's own /etc/libvirt/hooks (before it starts: no SIGHUP
    # to any libvirtd of this host)
    etc = tmp / "etc-libvirt"
    hook.install(etc / "hooks", {"socket": str(sock), "backend": "sim", "log": str(tmp / "hook.log")}, reload=False)
    env = {**os.environ, "VMGPU_LIBVIRT_ETC": str(etc)}
    subprocess.run([str(HERE / "libvirtd.sh"), "up"], check=True, env=env)
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("qemu:///system")
    client = Client(str(sock))
    try:
        yield conn, client, tmp, system_hooks
    finally:
        client.close()
        for d in conn.listAllDomains():
            if d.name().startswith("vmgpu-e2e-"):
                if d.isActive():
                    d.destroy()
                d.undefine()
        conn.close()
        subprocess.run([str(HERE / "libvirtd.sh"), "down"], check=False)
        daemon.terminate()
        daemon.wait()


def test_the_suite_leaves_the_systems_libvirt_hooks_alone(host):
    """A production hook in /etc/libvirt/hooks is neither replaced nor removed: the test
    libvirtd runs the vmgpu hook from its own directory (the other tests show it runs)."""
    conn, client, tmp, system_hooks = host
    assert _tree(HOOKS) == system_hooks
    assert (tmp / "etc-libvirt" / "hooks" / "qemu.d" / hook.HOOK_NAME).exists()


@pytest.fixture(scope="module")
def initrd(host, tmp_path_factory):
    native = guest.NATIVE
    progs = {
        "drv_api": native / "drv_api",
        "hold": native / "hold",
        "vmgpu-guest-agent": native / "guest" / "vmgpu-guest-agent",
        "vmgpu-smi": native / "guest" / "vmgpu-smi",
    }
    ptx = {"/vadd.ptx": guest.ROOT / "tests" / "cuda" / "vadd.ptx"}
    d = tmp_path_factory.mktemp("initrd")
    progs["runas"] = d / "runas"
    subprocess.run(["cc", "-O1", "-o", str(progs["runas"]), str(HERE / "runas.c")], check=True)
    return {
        "run": guest.build_initramfs(d / "run.cpio", progs, ptx, SCRIPT),
        "wait": guest.build_initramfs(d / "wait.cpio", progs, ptx, "vmgpu-guest-agent setup --gid 0\nsleep 600\n"),
    }


def define(conn, tmp: Path, name: str, initrd: Path, share: list[str]):
    console = tmp / f"{name}.console"
    console.unlink(missing_ok=True)
    conn.defineXML(guest.domain_xml(name, initrd, console))
    vmgpu = [sys.executable, "-m", "vmgpu.cli.main", "vm"]
    r = subprocess.run([*vmgpu, "attach", name, *share, "--heap", "16M"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    shown = subprocess.run([*vmgpu, "show", name, "--json"], capture_output=True, text=True)
    assert '"problem": null' in shown.stdout, shown.stdout + shown.stderr
    return conn.lookupByName(name), console


def test_cuda_programs_in_a_vm_run_through_the_host_forwarder(host, initrd):
    conn, client, tmp, _ = host
    dom, console = define(conn, tmp, "vmgpu-e2e-run", initrd["run"], ["--gpu", "0", "--mem", "256M"])
    t0 = time.monotonic()
    dom.create()
    assert [(s.guest, s.mem_mib) for s in client.status().slices] == [("vmgpu-e2e-run", 256)]
    assert wait_for(lambda: not dom.isActive(), timeout=240), "the guest did not power off"
    out = console.read_text(errors="replace")
    took = time.monotonic() - t0
    print(out, f"\n(guest ran {took:.1f} s)")
    for want in (
        # the agent's default: the region is its group's (vmgpu, made in a guest without it), 0660
        "created group vmgpu (gid 999) in /etc/group",
        "VMGPU-E2E default -rw-rw---- gid 999 vmgpu:x:999:",
        "VMGPU-E2E default-other rc=1",  # uid/gid 1000, not in the group: no GPU
        "vmgpu region: /dev/vmgpu/region",
        "VMGPU-E2E drv_api rc=0",
        "PASSED: 0 unexpected",
        "vadd result",
        "SIMULATED backend",
        f"free {256 << 20} {256 << 20}",
        "VMGPU-E2E hold0 rc=0",
        "alloc failed",  # 300 MiB is over the 256 MiB quota: CUDA_ERROR_OUT_OF_MEMORY in the guest
        "VMGPU-E2E hold300 rc=1",
        "quota MiB",  # vmgpu-smi (through the guest NVML): the quota table, and no process left holding memory
        "(no process of this guest holds GPU memory)",
        "VMGPU-E2E done",
    ):
        assert want in out, f"'{want}' not on the guest's console:\n{out}"
    assert "UNEXPECTED" not in out and "WRONG" not in out and "agent failed" not in out
    # shut down: libvirt's release hook gave the share back and removed the region
    assert wait_for(lambda: not client.status().slices, timeout=30), client.status()
    assert not client.status().forwarders and not Path("/dev/shm/vmgpu-vmgpu-e2e-run").exists()


def test_over_commit_is_refused_with_the_reason(host, initrd):
    import libvirt

    conn, client, tmp, _ = host
    client.admit("holder", "process", "gpu=0,mem=900M")
    try:
        dom, _ = define(conn, tmp, "vmgpu-e2e-over", initrd["run"], ["--gpu", "0", "--mem", "256M"])
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
        msg = str(e.value)
        assert "vmgpu: domain vmgpu-e2e-over cannot start" in msg and "REFUSED" in msg, msg
        assert "256" in msg and "124 MiB" in msg, msg  # what was asked and what was free
        assert not dom.isActive()
        assert [s.guest for s in client.status().slices] == ["holder"]
        assert not Path("/dev/shm/vmgpu-vmgpu-e2e-over").exists()
    finally:
        client.release("holder")


def test_virsh_destroy_releases_the_share(host, initrd):
    conn, client, tmp, _ = host
    dom, console = define(conn, tmp, "vmgpu-e2e-kill", initrd["wait"], ["--gpu", "0", "--mem", "512M"])
    dom.create()
    assert wait_for(lambda: client.status().forwarders, timeout=30)
    assert wait_for(lambda: "vmgpu region:" in console.read_text(errors="replace"), timeout=120), console.read_text()
    r = subprocess.run(["virsh", "-c", "qemu:///system", "destroy", "vmgpu-e2e-kill"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: not client.status().slices and not client.status().forwarders, timeout=30)
    assert not Path("/dev/shm/vmgpu-vmgpu-e2e-kill").exists()
