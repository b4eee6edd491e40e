"""Issue 14's hostile module image on a real GPU: a fatbin claiming 64 MiB in 4 KiB made the
driver read past its buffer and killed the worker.  It is refused on the host before the
driver sees it; the same worker then loads valid images (PTX, a synthetic cubin and fatbin,
nvcc's vadd.cubin) and still answers.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu/test_module_images_gpu.py`.
"""

import subprocess

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
