"""`vmgpu doctor`: what this host needs for vmgpu, what is wrong, and how to fix it (with --pool:
the pool's etcd members, and the route and MTU to each of its hosts)."""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from vmgpu import config, errors
from vmgpu.logging import get_logger


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""


def _driver() -> Check:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return Check(
            "NVIDIA driver",
            "fail",
            "libcuda.so.1 cannot be loaded",
            "install the NVIDIA driver (tests can use the simulated backend: --backend sim)",
        )
    if not os.path.exists("/dev/nvidia0"):
        return Check(
            "NVIDIA driver",
            "fail",
            "libcuda.so.1 loads but there is no /dev/nvidia0",
            "load the nvidia kernel module (modprobe nvidia) or check the device nodes",
        )
    return Check("NVIDIA driver", "ok", "libcuda.so.1 and /dev/nvidia0 present")


def _nvml() -> Check:
    from vmgpu import gpu

    try:
        gpus = gpu.nvml()
    except errors.VmgpuError as e:
        return Check("NVML", "fail", e.message, "vmgpud needs NVML for its inventory, or --inventory FILE")
    return Check("NVML", "ok", f"{len(gpus)} GPU(s): " + ", ".join(f"{g.index} {g.name}" for g in gpus))


def _native() -> Check:
    from vmgpu.forwarder import native_dir

    try:
        d = native_dir()
    except errors.VmgpuError as e:
        return Check("vmgpu native parts", "fail", e.message, "run `make native`")
    missing = [p for p in ("guest/libcuda.so.1", "libvmgpu-simcuda.so") if not (d / p).exists()]
    if missing:
        return Check("vmgpu native parts", "fail", f"{d}: missing {', '.join(missing)}", "run `make native`")
    return Check("vmgpu native parts", "ok", f"forwarder and guest library in {d}")


def _shm(min_free: int = 1 << 30) -> Check:
    path = config.SHM_DIR
    if not os.path.isdir(path) or not os.access(path, os.W_OK):
        return Check("/dev/shm", "fail", "missing or not writable", "mount a tmpfs on /dev/shm")
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free < min_free:
        return Check(
            "/dev/shm",
            "warn",
            f"only {free >> 20} MiB free; each guest's region lives here",
            "mount -o remount,size=16G /dev/shm (or larger)",
        )
    return Check("/dev/shm", "ok", f"{free >> 20} MiB free")


def _daemon(socket_path: str) -> list[Check]:
    from vmgpu.client import Client

    try:
        st = Client(socket_path, timeout=2, retry_s=0.5).status()
    except errors.DaemonUnavailable:
        return [Check("vmgpud", "warn", f"not answering on {socket_path}", "start it: vmgpu daemon")]
    except errors.VmgpuError as e:
        return [Check("vmgpud", "fail", e.message, "see vmgpud's log")]
    checks = [Check("vmgpud", "ok", f"{len(st.gpus)} GPU(s), {len({s.guest for s in st.slices})} guest(s) admitted")]
    sock_mode = stat.S_IMODE(os.stat(socket_path).st_mode)
    dir_mode = stat.S_IMODE(os.stat(Path(socket_path).parent).st_mode)
    if sock_mode & 0o077 or dir_mode & 0o077:
        checks.append(
            Check(
                "vmgpud socket",
                "warn",
                f"socket {oct(sock_mode)}, directory {oct(dir_mode)}: " "others can reach the daemon",
                f"chmod 600 {socket_path}; chmod 700 its directory",
            )
        )
    else:
        checks.append(Check("vmgpud socket", "ok", "owner only"))
    if st.settings.mps_dir:
        checks.append(
            Check("MPS control daemon", "ok", f"pid {st.settings.mps_pid} in {st.settings.mps_dir}")
            if st.settings.mps_pid
            else Check(
                "MPS control daemon",
                "fail",
                f"vmgpud --mps {st.settings.mps_dir}: not running (guests of a shared GPU take turns by time)",
                "see vmgpud's log (it tries to start it every second) and the daemon's logs in DIR/log",
            )
        )
    return checks


def _hook(hook: Path) -> Check:
    name = "libvirt qemu hook"
    if not hook.exists():
        return Check(name, "warn", f"{hook} not installed: VM guests are not admitted by vmgpu", "vmgpu hooks install")
    first = hook.read_text(errors="replace").split("\n", 1)[0]
    interpreter = first[2:].strip() if first.startswith("#!") else ""
    if not interpreter or not os.access(interpreter, os.X_OK):
        return Check(
            name,
            "fail",
            f"{hook} names the interpreter '{interpreter}', which is not there: every VM start will fail",
            "vmgpu hooks install (with the Python that has vmgpu)",
        )
    if not os.access(hook, os.X_OK):
        return Check(name, "fail", f"{hook} is not executable: libvirt skips it", f"chmod 755 {hook}")
    return Check(name, "ok", f"{hook} installed (runs {interpreter})")


def _libvirt() -> list[Check]:
    sock = "/run/libvirt/libvirt-sock"
    out = [
        Check("libvirtd", "ok", f"{sock} present")
        if os.path.exists(sock)
        else Check("libvirtd", "warn", f"no {sock}: VMs cannot be used", "start libvirtd (VM guests only)")
    ]
    from vmgpu.virt.hook import HOOK_NAME

    out.append(_hook(Path(config.LIBVIRT_HOOKS_DIR) / "qemu.d" / HOOK_NAME))
    return out


def _pool(url: str) -> list[Check]:
    """The pool's etcd members, and the route and MTU (pyroute2) from here to each of its hosts."""
    from vmgpu.pool import net
    from vmgpu.pool.records import HostRecord, load_all
    from vmgpu.pool.store import HOSTS, Store

    try:
        store = Store(url)
    except errors.VmgpuError as e:
        return [Check("pool", "fail", e.message, "--pool etcd://HOST:PORT[,HOST:PORT...]")]
    members = store.health()
    down = [m for m, what in members if what.startswith("down")]
    quorum = len(members) // 2 + 1
    if len(members) - len(down) < quorum:
        return [
            Check(
                "pool etcd",
                "fail",
                f"{len(members) - len(down)} of {len(members)} members answer (down: {', '.join(down)}): no quorum",
                "start the etcd members, or check the network to them",
            )
        ]
    status = "warn" if down else "ok"
    detail = f"{len(members) - len(down)} of {len(members)} members answer" + (
        f" (down: {', '.join(down)})" if down else ""
    )
    out = [Check("pool etcd", status, detail, "start the members that are down" if down else "")]
    try:
        entries, _ = store.range(HOSTS)
    except errors.VmgpuError as e:
        return [*out, Check("pool hosts", "fail", e.message, "check the etcd cluster's health")]
    hosts = [h for _, h in load_all(entries, HostRecord.load, get_logger(pool=url))]
    if not hosts:
        out.append(Check("pool hosts", "warn", "no host has joined", "vmgpu pool join on each GPU host"))
    for h in hosts:
        name = f"route to {h.host}"
        try:
            r = net.route_to(h.address)
        except errors.VmgpuError as e:
            out.append(Check(name, "fail", f"{h.address}: {e.message}", f"add a route to {h.address} (ip route)"))
            continue
        via = (
            f"{h.address} via {r.interface}"
            + (f" gw {r.gateway}" if r.gateway else "")
            + (f" from {r.source}" if r.source else "")
        )
        if r.mtu and r.mtu < net.MIN_MTU:
            out.append(
                Check(
                    name,
                    "warn",
                    f"{via}, MTU {r.mtu}: below {net.MIN_MTU}, the data plane's packets fragment",
                    f"raise the MTU of {r.interface} (ip link set {r.interface} mtu {net.MIN_MTU}) and on the path",
                )
            )
        else:
            out.append(Check(name, "ok", f"{via}, MTU {r.mtu}"))
    return out


def run_doctor(socket_path: str, pool_url: str | None = None) -> list[dict]:
    checks = [_driver(), _nvml(), _native(), _shm(), *_daemon(socket_path), *_libvirt()]
    if pool_url:
        checks += _pool(pool_url)
    return [asdict(c) for c in checks]
