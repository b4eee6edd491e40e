"""`docker run --runtime=vmgpu -e VMGPU=...` end to end with a real dockerd started by the
test (its own data root and socket; the image is imported from a rootfs the test builds, no
registry), vmgpud and forwarders on the simulated backend (no GPU here).

Needs root and Debian's docker.io (.ci/run installs it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.forwarder import start_daemon, wait_for
from tests.libvirt import guest
from vmgpu import oci
from vmgpu.client import Client

pytestmark = pytest.mark.docker
IMAGE = "vmgpu-test/cuda:local"
INVENTORY = '[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-0000000000dc"\nname = "ctr"\nmemory = "1G"\n'


class Docker:
    """A dockerd of the test's own.  runtime: registered as `vmgpu` (--add-runtime; None: the
    configuration's); wrap: how its command line is run (a mount namespace); extra: more options."""

    def __init__(self, tmp: Path, runtime: Path | None, wrap=lambda cmd: cmd, extra: tuple[str, ...] = ()):
        self.tmp, self.runtime, self.wrap, self.extra = tmp, runtime, wrap, extra
        self.sock = tmp / "docker.sock"
        self.proc = None

    def start(self):
        self.sock.unlink(missing_ok=True)
        log = open(self.tmp / "dockerd.log", "a")
        self.proc = subprocess.Popen(
            self.wrap([
                "dockerd",
                "--host", f"unix://{self.sock}",
                "--data-root", str(self.tmp / "data"),
                "--exec-root", str(self.tmp / "exec"),
                "--pidfile", str(self.tmp / "dockerd.pid"),
                "--bridge=none", "--iptables=false", "--ip-masq=false",
                "--storage-driver", "vfs",
                *(["--add-runtime", f"vmgpu={self.runtime}"] if self.runtime else []),
                *self.extra,
            ]),
            stdout=log,
            stderr=log,
        )  # fmt: skip
        assert wait_for(lambda: self("info", check=False).returncode == 0, timeout=60), self.log()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def log(self) -> str:
        return (self.tmp / "dockerd.log").read_text(errors="replace")[-4000:]

    def __call__(self, *args, check=True, timeout=120):
        r = subprocess.run(
            ["docker", "--host", f"unix://{self.sock}", *args], capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert r.returncode == 0, f"docker {' '.join(args)}: {r.stdout}{r.stderr}"
        return r


def import_image(docker: Docker, programs: dict[str, Path], files: dict[str, Path], native: Path = guest.NATIVE):
    """IMAGE, from a root file system holding programs and files (the runtime mounts the guest
    libraries: the image has none)."""
    rootfs = guest.build_rootfs(docker.tmp / "rootfs", programs, files, guest_lib=False, native=native)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "--host", f"unix://{docker.sock}", "import", "-", IMAGE], stdin=tar.stdout, check=True, timeout=120
    )
    tar.wait()


def need_docker() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd)")
    if not shutil.which("dockerd"):
        pytest.skip("docker.io is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    need_docker()
    tmp = tmp_path_factory.mktemp("docker")
    inv = tmp / "inventory.toml"
    inv.write_text(INVENTORY)
    sock = tmp / "run" / "vmgpud.sock"
    daemon = start_daemon(sock, tmp / "ledger.db", inv)
    runtime = tmp / "vmgpu-container-runtime"
    oci.install(
        runtime,
        {
            "socket": str(sock),
            "backend": "sim",
            "runc": shutil.which("runc"),
            "log": str(tmp / "rt.log"),
            "docker_root": str(tmp / "data"),  # the test's dockerd's --data-root: containers' names
        },
        tmp / "daemon.json",
    )
    docker = Docker(tmp, runtime)
    docker.start()
    import_image(
        docker,
        {"drv_api": guest.NATIVE / "drv_api", "hold": guest.NATIVE / "hold"},
        {"/vadd.ptx": guest.ROOT / "tests" / "cuda" / "vadd.ptx"},
    )
    client = Client(str(sock))
    try:
        yield docker, client, tmp
    finally:
        client.close()
        docker("rm", "-f", *docker("ps", "-aq").stdout.split(), check=False)
        docker.stop()
        daemon.terminate()
        daemon.wait()


def regions() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm/vmgpu-containers").glob("vmgpu-ctr-*"))


def run(docker, spec, *cmd, detach=False):
    return docker(
        "run", *(["-d"] if detach else ["--rm"]), "--runtime=vmgpu", "--network", "none",
        "-e", f"VMGPU={spec}", IMAGE, *cmd, check=False,
    )  # fmt: skip


def test_container_runs_cuda_through_its_forwarder(host):
    docker, client, tmp = host
    script = (
        "ls /dev | grep -c nvidia; /bin/hold 0 </dev/null; /bin/drv_api /vadd.ptx 24; echo drv_api rc=$?; "
        "/bin/hold 300 </dev/null; echo hold300 rc=$?; "
        "/usr/bin/vmgpu-smi --query-gpu=name,memory.total,memory.used --format=csv; /usr/bin/vmgpu-smi"
    )
    r = run(docker, "gpu=0,mem=256M,compute=10", "/bin/sh", "-c", script)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out + (tmp / "rt.log").read_text()
    assert out.splitlines()[0] == "0"  # no /dev/nvidia* inside
    assert "PASSED: 0 unexpected" in out and "vadd result" in out and "drv_api rc=0" in out
    assert f"free {256 << 20} {256 << 20}" in out, out  # the quota is the device
    assert "alloc failed" in out and "hold300 rc=1" in out  # over the quota: out of memory
    # nvidia-smi-style, inside the container: the runtime mounted the guest NVML and vmgpu-smi
    assert "name, memory.total [MiB], memory.used [MiB]" in out and ", 256 MiB, 0 MiB" in out, out
    assert "quota MiB" in out and "(no process of this guest holds GPU memory)" in out
    assert "SIMULATED backend" in out
    assert wait_for(lambda: not client.status().slices) and not regions()


def test_three_fill_the_gpu_a_fourth_waits_for_one_to_exit(host):
    docker, client, _ = host
    ids = []
    for _ in range(3):
        r = run(docker, "gpu=0,mem=340M,compute=30", "/bin/sleep", "600", detach=True)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    assert len(client.status().slices) == 3 and len(regions()) == 3
    client.admit("web-vm", "vm", "gpu=0,mem=4M,compute=10")  # a VM beside them
    st = subprocess.run(
        [sys.executable, "-m", "vmgpu.cli.main", "status", "--socket", client.socket_path, "--json"],
        capture_output=True,
        text=True,
    )
    kinds = sorted((g["guest"][:4], g["kind"]) for g in json.loads(st.stdout)["guests"])
    assert kinds == [("ctr-", "container")] * 3 + [("web-", "vm")], st.stdout + st.stderr
    client.release("web-vm")
    r = run(docker, "gpu=0,mem=340M,compute=30", "/bin/true")
    assert r.returncode != 0 and "REFUSED" in r.stderr and "asked 340 MiB, free 4 MiB" in r.stderr, r.stderr
    assert len(client.status().slices) == 3
    docker("stop", "-t", "1", ids[0])
    assert wait_for(lambda: len(client.status().slices) == 2, timeout=30)
    r = run(docker, "gpu=0,mem=340M,compute=30", "/bin/true")
    assert r.returncode == 0, r.stderr
    # kill -9 of a container: its share and region go with it
    docker("kill", "-s", "KILL", ids[1])
    assert wait_for(lambda: len(client.status().slices) == 1, timeout=30), client.status()
    assert len(regions()) == 1
    docker("rm", "-f", ids[0], ids[1])


def test_dockerd_restart_leaves_nothing_behind(host):
    docker, client, _ = host
    r = run(docker, "gpu=0,mem=100M,compute=10", "/bin/sleep", "600", detach=True)
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: any(s.mem_mib == 100 for s in client.status().slices))
    docker.stop()  # dockerd stops its containers
    docker.start()
    assert wait_for(lambda: not client.status().slices and not client.status().forwarders, timeout=30), client.status()
    assert not regions()
    time.sleep(0.1)


def test_a_container_shows_in_status_by_its_docker_name(host):
    docker, client, _ = host
    r = docker(
        "run", "-d", "--name", "web-named-1", "--runtime=vmgpu", "--network", "none",
        "-e", "VMGPU=gpu=0,mem=64M,compute=10", IMAGE, "/bin/sleep", "600", check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    try:
        (s,) = client.status().slices
        assert (s.guest, s.label) == (f"ctr-{cid[:12]}", "web-named-1")
        st = subprocess.run(
            [sys.executable, "-m", "vmgpu.cli.main", "status", "--socket", client.socket_path],
            capture_output=True,
            text=True,
        )
        assert f"web-named-1 (ctr-{cid[:12]})" in st.stdout, st.stdout + st.stderr
    finally:
        docker("rm", "-f", cid)
    assert wait_for(lambda: not client.status().slices, timeout=30)
