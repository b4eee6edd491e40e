"""A network of hosts on one machine, for the pool's tests: network namespaces joined by veth
pairs to a bridge (made with pyroute2), one per etcd member (three), per GPU host (its `vmgpu
pool join` agent) and for the guest.  Everything the lab makes (namespaces, processes, files)
is removed when it ends, killed processes first."""

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

SUBNET = "10.213.7"
ETCD = {"e1": 11, "e2": 12, "e3": 13}
HOSTS = {"ha": 21, "hb": 22}
GUEST_NS = "g"
TTL_S = 2
TLS_ENV = ("VMGPU_POOL_CA", "VMGPU_POOL_CERT", "VMGPU_POOL_KEY")
VMGPU = [sys.executable, "-m", "vmgpu.cli.main"]


def pytest_collection_modifyitems(config, items):
    why = None
    if os.geteuid() != 0:
        why = "needs root: the pool's tests make network namespaces and veth pairs"
    elif shutil.which("openssl") is None:
        why = "no openssl command (the lab's TLS certificates): apt-get install openssl"
    elif shutil.which("etcd") is None:
        why = "no etcd binary: apt-get install etcd-server (CI's .ci/run installs it)"
    elif not (Path(__file__).resolve().parents[2] / "build" / "native" / "vmgpu-netbridge").exists():
        why = "vmgpu-netbridge is not built (the hosts' data plane): apt-get install libssl-dev, make native"
    else:
        try:
            import pyroute2  # noqa: F401
        except ImportError:
            why = "pyroute2 is not installed (make venv)"
    if why:
        for item in items:
            if item.get_closest_marker("pool"):
                item.add_marker(pytest.mark.skip(reason=why))


def inventory(path: Path, host: str, count: int, mem: str) -> Path:
    path.write_text(
        "".join(
            f'[[gpu]]\nindex = {i}\nuuid = "GPU-{host}-{i:04d}"\nname = "Simulated {host}"\nmemory = "{mem}"\n'
            for i in range(count)
        )
    )
    return path


class Lab:
    def __init__(self, tmp: Path):
        from pyroute2 import netns

        self.netns = netns
        self.tmp = tmp
        self.tag = f"vp{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.procs: dict[str, subprocess.Popen] = {}
        # the members speak TLS and ask every client for its certificate (etcds://)
        self.url = "etcds://" + ",".join(f"{SUBNET}.{n}:2379" for n in ETCD.values())
        self.saved_env = {k: os.environ.get(k) for k in (*TLS_ENV, "VMGPU_SCHED_DIR")}
        # the hosts' forwarders keep their GPUs' scheduler pages here, not in the host's /dev/shm/vmgpu
        self.sched = tmp / "sched"
        os.environ["VMGPU_SCHED_DIR"] = str(self.sched)

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def address(self, name: str) -> str:
        return f"{SUBNET}.{({**ETCD, **HOSTS, GUEST_NS: 30})[name]}"

    # ---- TLS: a CA, the members' certificate, the clients' ---------------------------------
    def certificates(self) -> None:
        d = self.tmp / "tls"
        d.mkdir(mode=0o700)

        def ossl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        ossl(
            "req", "-x509", *ec, "-days", "2", "-subj", "/CN=vmgpu-pool-test-ca", "-keyout", "ca.key", "-out", "ca.pem"
        )
        sans = ",".join(f"IP:{self.address(n)}" for n in ETCD)
        for name, ext in (
            (
                "server",
                f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),  # its gateway is a client too
            ("client", "extendedKeyUsage=clientAuth\n"),
        ):
            ossl("req", *ec, "-subj", f"/CN=vmgpu-pool-{name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
            (d / f"{name}.ext").write_text(ext)
            ossl(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                f"{name}.ext",
                "-out",
                f"{name}.pem",
            )
            (d / f"{name}.key").chmod(0o600)
        self.tls = d
        os.environ.update(
            VMGPU_POOL_CA=str(d / "ca.pem"), VMGPU_POOL_CERT=str(d / "client.pem"), VMGPU_POOL_KEY=str(d / "client.key")
        )

    # ---- the network ------------------------------------------------------------------------
    def build(self) -> None:
        from pyroute2 import NetNS

        switch = self.ns("sw")
        self.netns.create(switch)
        self.namespaces.append(switch)
        with NetNS(switch) as sw:
            sw.link("add", ifname="br0", kind="bridge")
            br = sw.link_lookup(ifname="br0")[0]
            sw.link("set", index=br, state="up")
            for i, name in enumerate([*ETCD, *HOSTS, GUEST_NS]):
                full = self.ns(name)
                self.netns.create(full)
                self.namespaces.append(full)
                with NetNS(full) as ns:
                    ns.link("add", ifname="eth1", kind="veth", peer={"ifname": f"p{i}", "net_ns_fd": switch})
                    idx = ns.link_lookup(ifname="eth1")[0]
                    ns.addr("add", index=idx, address=self.address(name), prefixlen=24)
                    ns.link("set", index=idx, state="up")
                    ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
                port = sw.link_lookup(ifname=f"p{i}")[0]
                sw.link("set", index=port, master=br, state="up")

    def _enter(self, name: str):
        full = self.ns(name)
        return lambda: self.netns.setns(full)

    # ---- processes --------------------------------------------------------------------------
    def spawn(self, key: str, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{key}.log", "ab")
        p = subprocess.Popen(argv, preexec_fn=self._enter(name), stdout=log, stderr=log, cwd=self.tmp)
        log.close()
        self.procs[key] = p
        return p

    def kill(self, key: str) -> None:
        p = self.procs.pop(key)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def run(self, name: str, *args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
        """`vmgpu ARGS` in namespace name."""
        return subprocess.run(
            [*VMGPU, *args],
            preexec_fn=self._enter(name),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **(env or {})},
        )

    def python(self, name: str, script: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), *args],
            preexec_fn=self._enter(name),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def status(self) -> dict:
        r = self.run(GUEST_NS, "pool", "status", "--pool", self.url, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def wait_for(self, what: str, ok, timeout_s: float = 20.0):
        """Poll ok() until it is true (a readiness wait, not a timing assertion)."""
        end = time.monotonic() + timeout_s
        while True:
            value = ok()
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            time.sleep(0.2)

    # ---- etcd and the hosts ---------------------------------------------------------------
    def start_etcd(self, name: str, state: str = "new") -> None:
        cluster = ",".join(f"{n}=http://{self.address(n)}:2380" for n in ETCD)
        a = self.address(name)
        self.spawn(
            name,
            name,
            [
                "etcd",
                f"--name={name}",
                f"--data-dir={self.tmp / name}",
                f"--listen-peer-urls=http://{a}:2380",
                f"--initial-advertise-peer-urls=http://{a}:2380",
                f"--listen-client-urls=https://{a}:2379",
                f"--advertise-client-urls=https://{a}:2379",
                f"--cert-file={self.tls / 'server.pem'}",
                f"--key-file={self.tls / 'server.key'}",
                f"--trusted-ca-file={self.tls / 'ca.pem'}",
                "--client-cert-auth",
                f"--initial-cluster={cluster}",
                f"--initial-cluster-state={state}",
                "--initial-cluster-token=vmgpu-pool-test",
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ],
        )

    def join(self, host: str, *extra: str, key: str | None = None) -> subprocess.Popen:
        inv = inventory(self.tmp / f"{host}.toml", host, 2, "16G")
        return self.spawn(
            key or f"agent-{host}",
            host,
            [
                *VMGPU,
                "pool",
                "join",
                "--pool",
                self.url,
                "--host",
                host,
                "--ttl",
                str(TTL_S),
                "--inventory",
                str(inv),
                # its data plane: a forwarder per guest served (the simulated backend) and the bridge
                "--serve",
                str(self.tmp / f"plane-{host}"),
                "--backend",
                "sim",
                *extra,
            ],
        )

    def stop(self, key: str) -> None:
        """An orderly stop (SIGTERM): an agent stops its guests' forwarders, attach removes its region."""
        p = self.procs.pop(key)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def close(self) -> None:
        for key in list(self.procs):
            self.stop(key)
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        # what hosts killed on purpose left: their guests' regions (their forwarders ended with them)
        for host in HOSTS:
            for region in Path("/dev/shm").glob(f"vmgpu-pool-{host}-*"):
                region.unlink(missing_ok=True)
        for name in reversed(self.namespaces):
            try:
                self.netns.remove(name)
            except OSError:
                pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Three etcd members and two hosts (ha joined with --bind-net eth1, hb with --address), each
    in its own namespace, and a guest namespace; the hosts' GPUs: 2 x 16 GiB each."""
    lab = Lab(tmp_path_factory.mktemp("pool"))
    try:
        lab.certificates()
        lab.build()
        for name in ETCD:
            lab.start_etcd(name)
        lab.wait_for("the etcd cluster", lambda: lab.run(GUEST_NS, "pool", "status", "--pool", lab.url).returncode == 0)
        lab.join("ha", "--bind-net", "eth1")
        lab.join("hb", "--address", lab.address("hb"))
        lab.wait_for("both hosts joined", lambda: len(lab.status()["gpus"]) == 4)
        yield lab
    finally:
        lab.close()
    left = [n for n in lab.netns.listnetns() if n.startswith(lab.tag + "-")]
    assert not left, f"namespaces left behind: {left}"
