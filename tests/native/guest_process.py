"""A guest process for the native tests: a Python script on the guest's libcuda.so.1 (ctypes) that
reads one command per line and answers one line, "<CUresult> [value]" (each test file has its own
script), run command by command."""

import subprocess
import sys

from tests.forwarder import NATIVE, guest_env

GUEST_LIB = NATIVE / "guest" / "libcuda.so.1"

# How every script starts: the guest library (argv[1]), its common types, and a current context on
# the GPU argv[2].  A script is PRELUDE + its own commands.
PRELUDE = r"""
import ctypes, struct, sys
cuda = ctypes.CDLL(sys.argv[1])
u64, P, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
ctx = P()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), int(sys.argv[2])) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
"""


# The command loop a script's commands follow: each line's words as op and its arguments a; the
# commands set r (the CUresult) and out (the value), and the script prints them.
LOOP = r"""
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], w[1:]
    out = ""
"""


class Guest:
    """One guest process of the region, on one GPU, run command by command."""

    def __init__(self, region, gpu: int, script: str, lib=GUEST_LIB, env: dict | None = None):
        """lib and env: another library (the driver itself, for a native run) and its environment."""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, str(lib), str(gpu)],
            env=guest_env(region) if env is None else env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", line + self.stderr()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()

    def __call__(self, *words) -> tuple[int, str]:
        """Run a command: (CUresult, its value as text)."""
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"{words}: the guest process ended: {self.stderr()}"
        r, _, value = line.strip().partition(" ")
        return int(r), value

    def ok(self, *words) -> str:
        r, value = self(*words)
        assert r == 0, (words, r)
        return value

    def exit(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()
