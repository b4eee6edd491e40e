"""A GPU container through an installed vmgpu, the checkout out of reach: the wheel installed into
a virtual environment outside the checkout (tests/libvirt/installed.py, built once per session),
its `vmgpu setup` writing vmgpud's unit, the runtime and docker's daemon.json into a test root;
vmgpud started as that unit starts it, and a dockerd reading that daemon.json with the runtime at
/usr/local/bin where setup puts it, both where an empty tmpfs lies over the checkout.  A container
asking for a share runs the wheel's driver-API program with the guest libcuda.so.1 the runtime
mounts from the installed package, computing on the simulated backend, and the forwarder and its
worker run the wheel's programs.

Needs what tests/docker/test_containers.py needs (root, docker.io) and a mount namespace."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.docker.test_containers import IMAGE, Docker, import_image, need_docker, regions
from tests.forwarder import wait_for
from tests.libvirt import guest
from tests.libvirt.installed import RUNTIME, assert_serves_installed, hidden, installed, need_namespace
from vmgpu.client import Client

pytestmark = pytest.mark.docker
INVENTORY = '[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-0000000000dd"\nname = "inst"\nmemory = "1G"\n'


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    need_docker()
    need_namespace()
    inst = installed(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("installed-docker")
    root, daemon = inst.host(tmp, INVENTORY)
    # dockerd reads the daemon.json setup wrote, which names the runtime at /usr/local/bin; a system
    # containerd's socket hidden, it runs a containerd of its own (the runtime's parent) beside it
    docker = Docker(
        tmp,
        None,
        wrap=lambda cmd: hidden(
            cmd, binds=((root / "usr" / "local" / "bin", "/usr/local/bin"),), empty=("/run/containerd",)
        ),
        extra=("--config-file", str(root / "etc" / "docker" / "daemon.json")),
    )
    client = Client(str(tmp / "run" / "vmgpud.sock"))
    try:
        docker.start()
        import_image(
            docker,
            {"drv_api": inst.native / "demo" / "drv_api", "hold": guest.NATIVE / "hold"},
            {"/vadd.ptx": inst.native / "demo" / "vadd.ptx"},
            native=inst.native,
        )
        yield docker, client, tmp, inst, daemon, root
    finally:
        client.close()
        docker("rm", "-f", *docker("ps", "-aq", check=False).stdout.split(), check=False)
        docker.stop()
        daemon.terminate()
        daemon.wait()


def test_a_gpu_container_computes_through_the_installed_runtime_vmgpud_and_forwarder_with_the_checkout_out_of_reach(
    host,
):
    docker, client, tmp, inst, daemon, root = host
    conf = json.loads((root / "etc" / "docker" / "daemon.json").read_text())
    assert conf["runtimes"]["vmgpu"] == {"path": "/usr/local/bin/vmgpu-container-runtime"}
    assert (root / RUNTIME).read_text().startswith(f"#!{inst.python}\n")
    # hold keeps a worker busy until sleep ends its stdin: the test looks at that worker meanwhile
    script = "/bin/drv_api /vadd.ptx 24; echo drv_api rc=$?; sleep 10 | /bin/hold 64; echo hold rc=$?"
    r = docker(
        "run", "-d", "--runtime=vmgpu", "--network", "none", "-e", "VMGPU=gpu=0,mem=256M,weight=10",
        IMAGE, "/bin/sh", "-c", script, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    cid = r.stdout.strip()
    # the runtime ran where the checkout is hidden: under dockerd's own containerd, in its namespace
    # (a child of any of dockerd's threads: Go starts it from whichever thread runs the goroutine)
    tasks = Path(f"/proc/{docker.proc.pid}/task").iterdir()
    kids = [k for t in tasks for k in (t / "children").read_text().split()]
    containerd = [k for k in kids if Path(f"/proc/{k}/comm").read_text().strip() == "containerd"]
    assert containerd, "dockerd runs no containerd of its own: the runtime may have run outside the namespace"
    assert os.readlink(f"/proc/{containerd[0]}/ns/mnt") == os.readlink(f"/proc/{docker.proc.pid}/ns/mnt")
    assert os.readlink(f"/proc/{docker.proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    try:
        assert wait_for(lambda: "held" in docker("logs", cid, check=False).stdout, timeout=60), docker("logs", cid)
        assert_serves_installed(client, daemon.pid, inst)
        assert wait_for(lambda: docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "false", 60)
        logs = docker("logs", cid)
        out = logs.stdout + logs.stderr
    finally:
        docker("rm", "-f", cid, check=False)
    print(out)
    for want in ("PASSED: 0 unexpected", "vadd result", "drv_api rc=0", "SIMULATED backend", "hold rc=0"):
        assert want in out, f"'{want}' not in the container's output:\n{out}"
    assert wait_for(lambda: not client.status().slices and not client.status().forwarders, timeout=30)
    assert not regions()
    time.sleep(0.1)
