"""A tiny Linux guest for TCG domains: Debian's kernel and an initramfs the test builds,
holding busybox, the guest agent, the guest libcuda.so.1 and CUDA test programs (with the
shared libraries they need).  Its /init runs a script and ends the guest (a reboot, which
the domain turns into a stop); everything it prints goes to the serial console."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NATIVE = ROOT / "build" / "native"
KERNEL_DIR = ROOT / "build" / "vm"

INIT_HEAD = """#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp
echo "VMGPU-E2E booted"
"""


def kernel() -> Path:
    k = KERNEL_DIR / "vmlinuz"
    if not k.exists():
        subprocess.run([str(ROOT / "tests" / "libvirt" / "fetch-kernel.sh"), str(KERNEL_DIR)], check=True)
    return k


def _libs(binary: Path, search: list[Path]) -> set[Path]:
    """The shared libraries a binary loads (ldd), with LD_LIBRARY_PATH = search."""
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(map(str, search)))
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env).stdout
    libs = set()
    for ln in out.splitlines():
        parts = ln.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else ""
        if path.startswith("/"):
            libs.add(Path(path))
        elif "not found" in ln:
            raise FileNotFoundError(f"{binary}: {ln.strip()}")
    return libs


def build_rootfs(
    root: Path, programs: dict[str, Path], files: dict[str, Path], guest_lib: bool = True, native: Path = NATIVE
) -> Path:
    """A minimal root file system at root: busybox, the programs in /bin with the shared
    libraries they load, files at their paths, and (guest_lib) the guest libcuda.so.1 and
    libnvidia-ml.so.1 of native/guest (the build's, or an installed package's _native)."""
    shutil.rmtree(root, ignore_errors=True)
    for d in ("bin", "dev", "proc", "sys", "tmp", "lib/x86_64-linux-gnu", "lib64"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
    applets = subprocess.run([str(root / "bin" / "busybox"), "--list"], capture_output=True, text=True).stdout
    for a in applets.split():
        if a != "busybox":
            (root / "bin" / a).symlink_to("busybox")
    guestlib = native / "guest" / "libcuda.so.1"
    if guest_lib:
        shutil.copy2(guestlib, root / "lib/x86_64-linux-gnu/libcuda.so.1")
        shutil.copy2(guestlib.parent / "libnvidia-ml.so.1", root / "lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    libs: set[Path] = set(_libs(guestlib, []))
    for name, src in programs.items():
        shutil.copy2(src, root / "bin" / name)
        libs |= _libs(src, [native / "guest"])
    for lib in libs:
        if lib.name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            continue
        target = root / str(lib).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.resolve(), target)
    for path, src in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / path.lstrip("/"))
    return root


def build_initramfs(
    dest: Path, programs: dict[str, Path], files: dict[str, Path], script: str, native: Path = NATIVE
) -> Path:
    """An uncompressed newc cpio at dest holding build_rootfs() and an /init that runs script."""
    root = build_rootfs(dest.with_suffix(".d"), programs, files, native=native)
    init = root / "init"
    init.write_text(INIT_HEAD + script + "\necho 'VMGPU-E2E done'\nsync\nreboot -f\n")
    init.chmod(0o755)
    names = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True).stdout
    with open(dest, "wb") as out:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=names.encode(), stdout=out, check=True)
    shutil.rmtree(root)
    return dest


def domain_xml(name: str, initrd: Path, console: Path, memory_mib: int = 384, kernel_path: Path | None = None) -> str:
    """A TCG domain booting the kernel (kernel_path, default the fetched one) and initrd, its
    serial console in a file."""
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel_path or kernel()}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet loglevel=3</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>"""
