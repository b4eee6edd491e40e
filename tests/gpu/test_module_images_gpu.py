"""Issue 14's hostile module image on a real GPU: a fatbin claiming 64 MiB in 4 KiB made the
driver read past its buffer and killed the worker.  It is refused on the host before the
driver sees it; the same worker then loads valid images (PTX, a synthetic cubin and fatbin,
nvcc's vadd.cubin) and still answers.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu/test_module_images_gpu.py`.
"""

import subprocess
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, hidden_devices, log_text
from vmgpu.forwarder import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]


def test_a_fatbin_claiming_64_mib_in_4_kib_is_refused_and_the_worker_loads_the_next_image(shm_path):
    cubin = NATIVE / "vadd.cubin"
    assert cubin.exists(), "build/native/vadd.cubin is missing: run `make cuda-programs`"
    with forwarder(shm_path, backend="cuda", size="1G") as fwd:
        r = subprocess.run(
            hidden_devices([str(NATIVE / "tests" / "image_guest"), str(shm_path), "issue", str(cubin)]),
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = log_text(fwd)
        assert r.returncode == 0, r.stdout + r.stderr + text
        assert "fatbin claiming 64 MiB in 4 KiB: 200" in r.stdout  # CUDA_ERROR_INVALID_IMAGE
        assert "refused cleanly; the worker then loads valid images" in r.stdout
        assert fwd.proc.poll() is None
    text = log_text(fwd)
    assert "SIMULATED" not in text
    assert "died (signal" not in text and "failed (exit" not in text, text


def test_the_ptx_a_guest_loads_is_cached_in_its_forwarders_own_jit_cache_not_roots(shm_path, tmp_path):
    """The driver's JIT cache by default is $HOME/.nv/ComputeCache, shared by every guest of the
    host (one could tell from how fast its PTX loads whether another loaded the same).  A guest's
    PTX, compiled by the driver in its worker, is cached in jit/ of its forwarder's own image cache
    directory, and nothing is written under the forwarder's $HOME."""
    cubin = NATIVE / "vadd.cubin"
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "CUDA_CACHE_PATH": ""}
    with forwarder(shm_path, backend="cuda", size="1G", env=env) as fwd:
        r = subprocess.run(
            hidden_devices([str(NATIVE / "tests" / "image_guest"), str(shm_path), "issue", str(cubin)]),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr + log_text(fwd)
        caches = list(Path("/dev/shm").glob(f"vmgpu-images-{fwd.proc.pid}.*"))
        assert len(caches) == 1, caches
        cached = [p for p in (caches[0] / "jit").rglob("*") if p.is_file()]
        print("the guest's JIT cache:", [str(p.relative_to(caches[0])) for p in cached])
        assert cached, "the driver compiled the guest's PTX but cached nothing in the guest's own JIT cache"
    assert not caches[0].exists()
    assert not list(home.rglob("*")), sorted(str(p) for p in home.rglob("*"))
