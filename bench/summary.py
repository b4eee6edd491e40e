#!/usr/bin/env python3
"""The last line of `make bench`: the summary lines of the remoting, PyTorch and remote benches,
joined (the remote bench's keys prefixed remote_).

python3 bench/summary.py build/bench
"""

import sys
from pathlib import Path


def last(path: Path, prefix: str) -> str:
    if not path.exists():
        return f"{prefix}=missing"
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith(prefix + " ")]
    return lines[-1].split(" ", 1)[1] if lines else f"{prefix}=missing"


if __name__ == "__main__":
    d = Path(sys.argv[1] if len(sys.argv) > 1 else "build/bench")
    rows = last(d / "remote.txt", "remote").split()
    remote = " ".join(kv if kv.startswith("remote") else f"remote_{kv}" for kv in rows)
    print("bench", last(d / "remoting.txt", "remoting"), last(d / "pytorch.txt", "pytorch"), remote)
