"""The CUDA API generator (native/cuda_api/gen.py): its committed output is current, and a bad
spec entry is refused with a message naming it."""

import subprocess
import sys

import pytest

from tests.forwarder import (
    ROOT,
)

pytestmark = pytest.mark.native

GEN = ROOT / "native" / "cuda_api"


def test_generated_code_is_current():
    r = subprocess.run([sys.executable, str(GEN / "gen.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "entry, message",
    [
        ('cuMemAlloc_v2 = { op = 16, class = "sync" }', "pointer parameter dptr (CUdeviceptr *) is not described"),
        ('cuInit = { class = "local" }\ncuCtxSynchronize = { op = 7, class = "sync" }', "needs an op number"),
        (
            'cuCtxSynchronize = { op = 20, class = "sync" }\ncuCtxSetLimit = { op = 20, class = "sync" }',
            "op 20 already used by cuCtxSynchronize",
        ),
        ('cuNotAFunction = { op = 20, class = "sync" }', "not exported by the probed driver"),
        ('cuEventRecord = { op = 20, class = "async", out = ["hEvent"] }', "is not a pointer"),
    ],
)
def test_generator_refuses_a_bad_spec(tmp_path, entry, message):
    spec = tmp_path / "api.toml"
    spec.write_text(f'[handles]\nCUstream = "stream"\nCUevent = "event"\n\n[fn]\n{entry}\n')
    r = subprocess.run(
        [sys.executable, str(GEN / "gen.py"), "--check", "--spec", str(spec)], capture_output=True, text=True
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
