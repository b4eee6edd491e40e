"""Writing files that other programs read at any moment (libvirt's hooks, docker's
daemon.json, an OCI bundle's config.json): write beside, then rename over."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Replace path's content with text in one step; mode: set these permissions first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".vmgpu-tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)
    return path
