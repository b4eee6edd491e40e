"""The libvirt qemu hook as libvirt runs it: the installed script, `NAME OP SUB -` and the
domain XML on stdin, a bare environment, against a real vmgpud (simulated backend)."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.forwarder import start_daemon, wait_for
from tests.unit.test_daemon import INVENTORY
from vmgpu import shm, spec
from vmgpu.client import Client
from vmgpu.forwarder import is_forwarder
from vmgpu.virt import domain, hook

pytestmark = pytest.mark.native

BASE = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>"""


@pytest.fixture
def host(tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    sock, db = tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db"
    daemon = start_daemon(sock, db, inv)
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    out = hook.install(
        tmp_path / "hooks",
        {"socket": str(sock), "backend": "sim", "log": str(tmp_path / "hook.log"), "shm_dir": str(shm_dir)},
        reload=False,
    )
    client = Client(str(sock))
    yield Path(out["path"]), client, shm_dir, tmp_path / "hook.log"
    client.release("web1")
    client.close()
    daemon.terminate()
    daemon.wait()


def call(script: Path, name: str, op: str, xml: str):
    sub = "end" if op in ("stopped", "release") else "begin"
    env = {"LC_ALL": "C", "HOME": "/root", "PATH": "/usr/bin:/bin"}  # what libvirtd gives a hook
    return subprocess.run([str(script), name, op, sub, "-"], input=xml, env=env, capture_output=True, text=True)


def vm_xml(name="web1", share="gpu=0,mem=8G,compute=50", heap=16):
    return domain.attach(BASE.format(name=name), spec.parse(share), heap)


def test_installed_script_names_its_interpreter_and_settings(host):
    script, *_ = host
    text = script.read_text()
    assert text.startswith("#!/") and "'backend': 'sim'" in text
    assert os.access(script, os.X_OK)


def test_a_domain_without_vmgpu_is_left_alone(host):
    script, client, shm_dir, _ = host
    for op in ("prepare", "started", "stopped", "release"):
        r = call(script, "plain", op, BASE.format(name="plain"))
        assert r.returncode == 0, r.stderr
    assert not list(shm_dir.iterdir()) and not client.status().slices


def test_a_vm_lifecycle_admits_serves_and_releases(host):
    script, client, shm_dir, log = host
    xml = vm_xml()
    r = call(script, "web1", "prepare", xml)
    assert r.returncode == 0, r.stderr + log.read_text()
    region = shm_dir / "vmgpu-web1"
    assert region.stat().st_size == domain.region_size_mib(16) << 20  # exactly the device's size (QEMU insists)
    reg = shm.Region.open(region)
    assert reg.check().wait_mode == shm.WAIT_POLL  # the guest is another kernel: no futex
    reg.close()
    assert [(s.guest, s.gpu_index, s.mem_mib, s.compute_pct) for s in client.status().slices] == [("web1", 0, 8192, 50)]
    assert call(script, "web1", "prepare", xml).returncode == 0  # a retried prepare is harmless

    r = call(script, "web1", "started", xml)
    assert r.returncode == 0, r.stderr + log.read_text()
    (fwd,) = client.status().forwarders
    assert fwd.guest == "web1" and is_forwarder(fwd.pid, region)
    # libvirtd restarted: reconnect finds the forwarder running and starts no second one
    assert call(script, "web1", "reconnect", xml).returncode == 0
    assert [f.pid for f in client.status().forwarders] == [fwd.pid]

    assert call(script, "web1", "stopped", xml).returncode == 0
    wait_for(lambda: not is_forwarder(fwd.pid, region))
    assert call(script, "web1", "release", xml).returncode == 0
    assert not region.exists() and not client.status().slices and not client.status().forwarders
    assert '"event": "admitted"' in log.read_text()


def test_over_commit_is_refused_with_the_reason(host):
    script, client, shm_dir, _ = host
    client.admit("other", "vm", "gpu=0,mem=30G")
    try:
        r = call(script, "web1", "prepare", vm_xml(share="gpu=0,mem=8G"))
        assert r.returncode == 1
        assert r.stderr.startswith("vmgpu: domain web1 cannot start:") and "[REFUSED]" in r.stderr
        assert "GPU 0" in r.stderr or "gpu 0" in r.stderr
        assert not (shm_dir / "vmgpu-web1").exists()
        assert [s.guest for s in client.status().slices] == ["other"]
    finally:
        client.release("other")


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda x: x.replace('<size unit="M">128</size>', '<size unit="M">100</size>'), "must be a power of two"),
        (lambda x: x[: x.index("<shmem")] + x[x.index("</shmem>") + 8 :], "no <shmem name='vmgpu-web1'> device"),
    ],
)
def test_inconsistent_xml_is_refused_at_start_with_the_fix(host, edit, words):
    script, client, shm_dir, _ = host
    r = call(script, "web1", "prepare", edit(vm_xml()))
    assert r.returncode == 1 and words in r.stderr, r.stderr
    assert not client.status().slices and not list(shm_dir.iterdir())


def test_a_stale_reservation_is_replaced_at_prepare(host):
    script, client, _, _ = host
    client.admit("web1", "vm", "gpu=1,mem=1G")  # left behind by a run whose release never came
    assert call(script, "web1", "prepare", vm_xml()).returncode == 0
    assert [(s.gpu_index, s.mem_mib) for s in client.status().slices] == [(0, 8192)]


def test_vmgpud_down_refuses_quickly(tmp_path):
    out = hook.install(tmp_path / "hooks", {"socket": str(tmp_path / "none.sock"), "log": str(tmp_path / "l")}, False)
    r = call(Path(out["path"]), "web1", "prepare", vm_xml())
    assert r.returncode == 1 and "DAEMON_UNAVAILABLE" in r.stderr, r.stderr


def test_doctor_checks_the_installed_hook(tmp_path):
    from vmgpu.doctor import _hook

    path = tmp_path / "qemu.d" / hook.HOOK_NAME
    assert _hook(path).status == "warn"
    hook.install(tmp_path, {}, reload=False)
    assert _hook(path).status == "ok"
    path.write_text("#!/nonexistent/python\n")
    bad = _hook(path)
    assert bad.status == "fail" and "/nonexistent/python" in bad.detail and bad.fix.startswith("vmgpu hooks install")
