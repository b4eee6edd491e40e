"""The GPU-host halves of the VM and container end-to-end checks, where there is neither
libvirt nor dockerd nor apt.

On a dev machine (Debian, with qemu-system-x86, busybox-static and cpio installed, after
`make native cuda-programs`):

    python3 -m tests.gpu.hostrun pack .carry/hostrun

packs a portable QEMU (the binary, the libraries it loads other than glibc's, the TCG
accelerator module and its firmware), Debian's kernel, a guest initramfs (busybox, the guest
agent, vmgpu-smi, the guest libcuda.so.1 and nvcc-built programs) and a container root file
system (the same programs, no libcuda.so.1: the runtime mounts it).  Carry that folder to the
GPU host and run there:

    python3 -m tests.gpu.hostrun vm .carry/hostrun         # a TCG guest through ivshmem
    python3 -m tests.gpu.hostrun container .carry/hostrun  # the rootfs in its own mount namespace

Each starts a forwarder on the real GPU, runs the programs, prints what they printed and
exits 0 only if every program ran correctly and the forwarder served the real driver.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from tests.libvirt import guest
from vmgpu import oci
from vmgpu.forwarder import Forwarder, native_dir

QEMU = Path("/usr/bin/qemu-system-x86_64")
TCG_MODULE = Path("/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so")
GLIBC = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux")
REGION_SIZE = "512M"
# (argv in the guest, what its correct output contains)
PROGRAMS = [
    (["vecadd", "262144"], "vecadd ok n=262144"),
    (["matmul", "256"], "matmul n=256"),
    (["devquery"], "total_mem 4294967296"),
]
BACKEND = "cuda"  # --backend sim: a smoke run of the plumbing on a machine without a GPU


def _programs() -> dict[str, Path]:
    n = guest.NATIVE
    return {
        "vecadd": n / "vecadd",
        "matmul": n / "matmul",
        "devquery": n / "devquery",
        "vmgpu-guest-agent": n / "guest" / "vmgpu-guest-agent",
        "vmgpu-smi": n / "guest" / "vmgpu-smi",
    }


# glibc's libraries that the driver's nvidia-smi loads besides libc (it is added on the GPU host)
GLIBC_EXTRA = {
    f"/lib/x86_64-linux-gnu/{n}": Path(f"/lib/x86_64-linux-gnu/{n}")
    for n in ("libdl.so.2", "librt.so.1", "libpthread.so.0", "libm.so.6")
}
# what the guest runs after the programs: its view of the GPU through the guest NVML
NVML_CHECKS = (
    "/bin/vmgpu-smi --query-gpu=name,memory.total,memory.used --format=csv\n"
    'if [ -x /usr/bin/nvidia-smi ]; then /usr/bin/nvidia-smi; echo "VMGPU-E2E nvidia-smi rc=$?"; fi\n'
)


def _script() -> str:
    lines = ["vmgpu-guest-agent setup --gid 0 || echo 'VMGPU-E2E agent failed'"]
    for argv, _ in PROGRAMS:
        lines.append(f"/bin/{' '.join(argv)}; echo \"VMGPU-E2E {argv[0]} rc=$?\"")
    lines.append("/bin/vmgpu-smi")
    return "\n".join(lines) + "\n" + NVML_CHECKS


def _cpio(files: dict[str, Path]) -> bytes:
    """A newc cpio archive of files (path in the archive -> file here), with their directories:
    appended to an initramfs, the kernel unpacks it over the first."""
    out, ino = bytearray(), 1

    def entry(name: str, mode: int, data: bytes) -> None:
        nonlocal ino
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0")
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))
        ino += 1

    dirs = set()
    for p in files:
        parts = Path(p.lstrip("/")).parent.parts
        dirs |= {"/".join(parts[: i + 1]) for i in range(len(parts))}
    for d in sorted(dirs):
        entry(d, 0o40755, b"")
    for p, src in files.items():
        entry(p.lstrip("/"), 0o100755, src.read_bytes())
    entry("TRAILER!!!", 0, b"")
    return bytes(out)


def _qemu_tree(dest: Path) -> None:
    for d in ("bin", "lib", "modules", "share"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(QEMU, dest / "bin" / QEMU.name)
    shutil.copy2(TCG_MODULE, dest / "modules" / TCG_MODULE.name)
    libs = guest._libs(QEMU, []) | guest._libs(TCG_MODULE, [])
    for lib in libs:
        if not lib.name.startswith(GLIBC):
            shutil.copy2(lib.resolve(), dest / "lib" / lib.name)
    shutil.copytree("/usr/share/qemu", dest / "share" / "qemu", symlinks=False, dirs_exist_ok=True)
    shutil.copytree("/usr/share/seabios", dest / "share" / "seabios", dirs_exist_ok=True)


def pack(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "qemu"
        _qemu_tree(tree)
        with tarfile.open(dest / "qemu.tar.gz", "w:gz") as t:
            t.add(tree, arcname="qemu")
        shutil.copy2(guest.kernel(), dest / "vmlinuz")
        guest.build_initramfs(dest / "guest.cpio", _programs(), GLIBC_EXTRA, _script())
        root = guest.build_rootfs(Path(tmp) / "rootfs", _programs(), GLIBC_EXTRA, guest_lib=False)
        with tarfile.open(dest / "rootfs.tar.gz", "w:gz") as t:
            t.add(root, arcname="rootfs")
    for f in sorted(dest.iterdir()):
        print(f"{f}  {f.stat().st_size >> 20} MiB")


def _check(out: str, fwd: Forwarder) -> int:
    bad = []
    for argv, want in PROGRAMS:
        if f"VMGPU-E2E {argv[0]} rc=0" not in out or want not in out:
            bad.append(f"{argv[0]}: no 'rc=0' and '{want}'")
    if BACKEND == "cuda" and "SIMULATED" in fwd.log():
        bad.append("the forwarder ran the simulated backend, not the GPU")
    if "WRONG" in out:
        bad.append("a program computed a wrong result")
    if "agent failed" in out:
        bad.append("the guest agent failed")
    if "name, memory.total [MiB], memory.used [MiB]" not in out or ", 4096 MiB, " not in out:
        bad.append("vmgpu-smi did not show the 4096 MiB quota through the guest NVML")
    if shutil.which("nvidia-smi") and ("VMGPU-E2E nvidia-smi rc=0" not in out or "MiB /   4096MiB" not in out):
        bad.append("the driver's nvidia-smi did not show the guest's 4096 MiB slice")
    for b in bad:
        print(f"FAILED: {b}")
    print("hostrun:", "all programs correct through vmgpu on the GPU" if not bad else f"{len(bad)} failure(s)")
    return 1 if bad else 0


def _unpack(src: Path, name: str) -> tuple[Path, Path]:
    """A fresh work folder with src/NAME.tar.gz unpacked in it; (the folder, what was unpacked)."""
    work = Path(tempfile.mkdtemp(prefix="vmgpu-hostrun-"))
    with tarfile.open(src / f"{name}.tar.gz") as t:
        t.extractall(work)
    return work, work / name


def _finish(work: Path, out: str, fwd: Forwarder) -> int:
    """Show what the programs printed and the forwarder's last lines, clean up, judge."""
    print(out)
    print("--- forwarder log (tail) ---\n" + "\n".join(fwd.log().splitlines()[-8:]))
    shutil.rmtree(work, ignore_errors=True)
    return _check(out, fwd)


def vm(src: Path, timeout: float) -> int:
    work, tree = _unpack(src, "qemu")
    region = Path(f"/dev/shm/vmgpu-hostrun-vm-{os.getpid()}")
    console = work / "console"
    initrd = src / "guest.cpio"
    smi = shutil.which("nvidia-smi")
    if smi:  # the driver's nvidia-smi, added to the guest's initramfs
        initrd = work / "guest-smi.cpio"
        initrd.write_bytes((src / "guest.cpio").read_bytes() + _cpio({"/usr/bin/nvidia-smi": Path(smi)}))
    fwd = Forwarder(region, backend=BACKEND, size=REGION_SIZE, mem="4G", guest="hostrun-vm", extra=("--wait", "poll"))
    fwd.start()
    env = dict(os.environ, QEMU_MODULE_DIR=str(tree / "modules"), LD_LIBRARY_PATH=str(tree / "lib"))
    cmd = [
        str(tree / "bin" / QEMU.name), "-L", str(tree / "share" / "qemu"), "-accel", "tcg", "-m", "512",
        "-display", "none", "-monitor", "none", "-no-reboot", "-net", "none",
        "-serial", f"file:{console}",
        "-kernel", str(src / "vmlinuz"), "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 quiet loglevel=3",
        "-object", f"memory-backend-file,id=vmgpu,share=on,mem-path={region},size={REGION_SIZE}",
        "-device", "ivshmem-plain,memdev=vmgpu",
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    try:
        q = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        print(f"qemu exited {q.returncode} after {time.monotonic() - t0:.1f} s {q.stderr.strip()}")
    except subprocess.TimeoutExpired:
        print(f"qemu did not finish in {timeout} s")
    finally:
        fwd.stop()
        region.unlink(missing_ok=True)
    out = console.read_text(errors="replace") if console.exists() else ""
    return _finish(work, out, fwd)


def container(src: Path, timeout: float) -> int:
    work, root = _unpack(src, "rootfs")
    smi = shutil.which("nvidia-smi")
    if smi:  # the driver's nvidia-smi, in the image as a user would have it
        (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(smi, root / "usr" / "bin" / "nvidia-smi")
    region = Path(f"/dev/shm/vmgpu-hostrun-ctr-{os.getpid()}")
    fwd = Forwarder(region, backend=BACKEND, size="256M", mem="4G", guest="hostrun-ctr")
    fwd.start()
    # The mounts vmgpu's OCI runtime gives a container, applied by hand: a private mount
    # namespace, a fresh /dev without any NVIDIA node, the region and the guest library.
    config = oci.rewrite({"mounts": [], "process": {"env": []}}, region, native_dir() / "guest" / "libcuda.so.1")
    binds = []
    for m in config["mounts"]:
        target = root / m["destination"].lstrip("/")
        ro = "ro" in m["options"]
        binds.append(f"mkdir -p {target.parent} && touch {target} && mount --bind {m['source']} {target}")
        if ro:
            binds.append(f"mount -o remount,bind,ro {target}")
    env = " ".join(config["process"]["env"])
    (root / "run.sh").write_text(
        "echo \"/dev holds: $(ls /dev | tr '\\n' ' ')\"\n"
        "ls /dev | grep -q nvidia && echo 'VMGPU-E2E NVIDIA NODE'\n"
        + "".join(f"/bin/{' '.join(argv)}; echo \"VMGPU-E2E {argv[0]} rc=$?\"\n" for argv, _ in PROGRAMS)
        + NVML_CHECKS.replace("/bin/vmgpu-smi", "/usr/bin/vmgpu-smi")
    )
    script = " && ".join(
        [
            "mount --make-rprivate /",
            f"mount -t tmpfs -o mode=755 dev {root}/dev",
            f"mount -t proc proc {root}/proc",
            *binds,
            f"chroot {root} /bin/env -i PATH=/bin {env} /bin/sh /run.sh",
        ]
    )
    print("$ unshare --mount --fork sh -c", repr(script), flush=True)
    try:
        p = subprocess.run(["unshare", "--mount", "--fork", "sh", "-c", script], capture_output=True, text=True,
                           timeout=timeout)  # fmt: skip
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = f"timed out after {timeout} s: {e.stdout}{e.stderr}"
    finally:
        fwd.stop()
        region.unlink(missing_ok=True)
    rc = _finish(work, out, fwd)
    if "NVIDIA NODE" in out:
        print("FAILED: an NVIDIA device node is visible in the container")
        rc = 1
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("pack", "vm", "container"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    a = ap.parse_args()
    global BACKEND
    BACKEND = a.backend
    if a.what == "pack":
        pack(a.dir)
        return 0
    return (vm if a.what == "vm" else container)(a.dir, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
