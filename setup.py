"""vmgpu's build step for a wheel (or an sdist built into one): `make native` into a fresh
directory, and what an installed host needs of it copied into the package as vmgpu/_native/
(vmgpu/forwarder.py's native_dir() and vmgpu/shm_lib.py look there first):

    vmgpu-forwarder, libvmgpu-simcuda.so, libvmgpushm.so
    guest/libcuda.so.1, guest/libnvidia-ml.so.1, guest/vmgpu-guest-agent, guest/vmgpu-smi
    demo/drv_api, demo/vadd.ptx (what `vmgpu demo` runs), and demo/vecadd_ptx where the build has
    nvcc ($NVCC, which may carry arguments, else nvcc on PATH or /usr/local/cuda/bin/nvcc)

cuda.h and nvml.h: $CUDA_INCLUDE / $NVML_INCLUDE where set (a CUDA toolkit's), else NVIDIA's
header wheels that pyproject.toml's build requirements put in the build environment.  An
editable install (`make venv`) builds nothing: a checkout uses its build/native.  Everything
else about the package is in pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
OPTIONAL_NATIVE_FILES = ("vmgpu-netbridge",)
NATIVE_FILES = (
    "vmgpu-forwarder",
    "libvmgpu-simcuda.so",
    "libvmgpushm.so",
    "guest/libcuda.so.1",
    "guest/libnvidia-ml.so.1",
    "guest/vmgpu-guest-agent",
    "guest/vmgpu-smi",
)
# `vmgpu demo` (vmgpu/demo.py): the driver-API program with its PTX, and an nvcc-built vector add
# that carries its kernel as PTX (which the simulated backend runs), where nvcc is there
DEMO_DIR = "demo"
DEMO_NATIVE = ("drv_api",)
DEMO_SOURCES = {"vadd.ptx": "tests/cuda/vadd.ptx"}
DEMO_NVCC = ("vecadd_ptx", "tests/cuda/vecadd.cu", ["-O2", "-gencode=arch=compute_90,code=compute_90", "-no-compress"])


def _nvcc() -> list[str] | None:
    """The nvcc command the build has, or None."""
    if os.environ.get("NVCC"):
        return shlex.split(os.environ["NVCC"])
    toolkit = "/usr/local/cuda/bin/nvcc"
    found = shutil.which("nvcc") or (toolkit if os.access(toolkit, os.X_OK) else None)
    return [found] if found else None


def _header_dir(env: str, dist: str, header: str) -> str:
    """The directory holding header: $env if set, else the one the wheel `dist` installed."""
    if os.environ.get(env):
        return os.environ[env]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == header:
            return str(Path(f.locate()).parent)
    raise SystemExit(f"vmgpu build: {header} not found: set {env} to a directory holding it, or install {dist}")


class BuildNative(build_py):
    """build_py, then the native programs into build_lib/vmgpu/_native/."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "vmgpu" / "_native"
        with tempfile.TemporaryDirectory(prefix="vmgpu-native-") as tmp:
            cmd = [
                os.environ.get("MAKE", "make"),
                "-C",
                str(HERE),
                "native",
                f"BUILD={tmp}",
                f"CUDA_INCLUDE={_header_dir('CUDA_INCLUDE', 'nvidia-cuda-runtime', 'cuda.h')}",
                f"NVML_INCLUDE={_header_dir('NVML_INCLUDE', 'nvidia-nvml-dev', 'nvml.h')}",
            ]
            self.announce("running " + " ".join(cmd), level=2)
            subprocess.run(cmd, check=True)
            if dest.exists():
                shutil.rmtree(dest)
            for name in NATIVE_FILES:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(tmp) / "native" / name, dest / name)
            # built only where OpenSSL's headers were (libssl-dev): a host without them is a
            # host that neither serves nor attaches remote guests
            for name in OPTIONAL_NATIVE_FILES:
                if (Path(tmp) / "native" / name).exists():
                    shutil.copy2(Path(tmp) / "native" / name, dest / name)
            self._demo(Path(tmp) / "native", dest / DEMO_DIR)

    def _demo(self, native: Path, demo: Path) -> None:
        demo.mkdir(parents=True, exist_ok=True)
        for name in DEMO_NATIVE:
            shutil.copy2(native / name, demo / name)
        for name, src in DEMO_SOURCES.items():
            shutil.copy2(HERE / src, demo / name)
        nvcc = _nvcc()
        name, src, flags = DEMO_NVCC
        if nvcc is None:
            self.announce(f"no nvcc (set NVCC): the wheel's demo has no {name}", level=3)
            return
        subprocess.run([*nvcc, *flags, "-o", str(demo / name), str(HERE / src)], check=True)


class PlatformWheel(bdist_wheel):
    """A wheel for this platform (it carries native programs), for any Python 3 (no extension
    module: the Python side loads libvmgpushm.so with ctypes)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildNative, "bdist_wheel": PlatformWheel})
