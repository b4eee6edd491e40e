"""The host's MPS control daemon, run by vmgpud when it is told to (`vmgpu daemon --mps DIR`), so
that the guests on a GPU whose policy is `shared` run side by side on its SMs, each on its span.

A forwarder is started with `--mps DIR/pipe --mps-when shared`: a guest process becomes a client of
this daemon's MPS server only if one of its GPUs is shared as it starts; every other keeps a
context of its own, outside the MPS server's fault domain (NVIDIA documents that a fatal fault of
one client can end every client of the GPU).  The daemon is `nvidia-cuda-mps-control -d` with its
pipes in DIR/pipe and its logs in DIR/log.  DIR and both below it are root's and reachable by no one
else: the daemon's control pipe takes commands (`quit`) from anyone who can open it, and whoever
could put a pipe there would be served every call of the guests'.

vmgpud starts the daemon if none runs there, keeps one that does (vmgpud stopping leaves it running,
as it leaves the forwarders: their guests' processes are its clients), and starts it again if it
dies (Supervisor.watch).  The daemon writes its pid to DIR/pipe/nvidia-cuda-mps-control.pid.
The guest processes that start after it is back are its clients; what becomes of the running
clients of a daemon that died was not measured.  To stop it (a driver upgrade): `echo quit |
CUDA_MPS_PIPE_DIRECTORY=DIR/pipe nvidia-cuda-mps-control` with vmgpud stopped.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from vmgpu import files
from vmgpu.errors import MpsError, UnsafePath
from vmgpu.logging import get_logger

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
START_S = 10.0  # how long a started daemon has to write its pid


class Mps:
    """The MPS control daemon whose pipes are in `directory`/pipe."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.pipe, self.logs = self.dir / "pipe", self.dir / "log"
        self.log = get_logger(component="mps")

    def env(self) -> dict:
        """The daemon's environment (and its servers'): its directories, and no JIT cache (were its
        server to compile a guest's PTX, root's shared ~/.nv/ComputeCache would keep it for all)."""
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.logs),
            "CUDA_CACHE_DISABLE": "1",
        }

    def prepare(self) -> None:
        """Make the directories (root's, 0700), or refuse ones someone else could reach or swap."""
        if not self.dir.is_absolute():
            raise UnsafePath(f"the MPS directory {self.dir} is not an absolute path")
        self.dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        files.check_path_above(self.dir, "the MPS directory")
        for d in (self.dir, self.pipe, self.logs):
            files.private_dir(d)
            mode = stat.S_IMODE(os.lstat(d).st_mode)
            if mode & 0o077:
                raise UnsafePath(
                    f"the MPS directory {d} has mode {mode:04o}: anyone who can reach the MPS control pipe can "
                    "stop the daemon, so it must be reachable by its owner alone (chmod 0700 it)"
                )

    def pid(self) -> int | None:
        """The running daemon's pid, or None: the pid its file names, if that process is ours (root's:
        another user's cannot pass for it) and was started with this pipe directory (a stale file
        naming a pid reused by another process, or another daemon's, does not pass)."""
        try:
            pid = int((self.pipe / PID_FILE).read_text().strip() or 0)
            if pid <= 0 or os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                return None
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if f"CUDA_MPS_PIPE_DIRECTORY={self.pipe}".encode() in env else None

    def ensure(self) -> int:
        """The daemon's pid, started first if none runs (the directories checked each time)."""
        self.prepare()
        running = self.pid()
        if running:
            return running
        control = shutil.which(CONTROL)
        if not control:
            raise MpsError(
                f"{CONTROL} is not on PATH: install the NVIDIA driver's utilities, or run vmgpud without --mps "
                "(guests of a shared GPU then take turns by time)"
            )
        (self.pipe / PID_FILE).unlink(missing_ok=True)
        said = self.logs / "start.log"  # (what it says as it starts: a file, not a pipe its daemon could keep open)
        with open(said, "w") as out:
            rc = subprocess.run(
                [control, "-d"], env=self.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            ).returncode
        deadline = time.monotonic() + START_S
        while rc == 0 and not self.pid() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = self.pid()
        if rc != 0 or not pid:
            text = " ".join(said.read_text(errors="replace").split())[:200] or "it wrote no pid"
            raise MpsError(
                f"the MPS control daemon did not start ({control} -d exited {rc}: {text}); its logs: {self.logs}"
            )
        self.log.info("mps control daemon started", pid=pid, pipe=str(self.pipe))
        return pid
