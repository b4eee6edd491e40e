#!/usr/bin/env python3
"""Generate both sides of vmgpu's CUDA driver API from api.toml.

    python3 native/cuda_api/gen.py [--check] [--cuda-include DIR]

Inputs: api.toml (what is served and how each pointer is used), export_tables.toml (the
export tables' layouts and UUIDs), cuda.h (prototypes, read through the C preprocessor),
driver/libcuda_exports.txt, driver/procaddr.tsv and driver/export_tables.txt (probed from a
real driver by probe_driver.py).  Output: generated/ (committed).
--check regenerates into memory and fails if generated/ differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from generator import CUDA_API_DIR, SpecError, generate

OUT = os.path.join(CUDA_API_DIR, "generated")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if generated/ is out of date")
    ap.add_argument("--cuda-include", default=os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include"))
    ap.add_argument("--spec", default=os.path.join(CUDA_API_DIR, "api.toml"), help="the API spec (default: api.toml)")
    ap.add_argument(
        "--exports",
        default=os.path.join(CUDA_API_DIR, "export_tables.toml"),
        help="the export tables' layouts (default: export_tables.toml)",
    )
    a = ap.parse_args()
    try:
        files = generate(a.cuda_include, a.spec, a.exports)
    except (SpecError, subprocess.CalledProcessError) as e:
        print(f"gen.py: {e}", file=sys.stderr)
        return 2
    stale = []
    for name, text in files.items():
        path = os.path.join(OUT, name)
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(name)
            if not a.check:
                os.makedirs(OUT, exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
    if a.check and stale:
        print(f"gen.py: generated files are out of date: {', '.join(stale)}; run `make gen`", file=sys.stderr)
        return 1
    print(f"gen.py: {len(files)} files, {'up to date' if not stale else 'written: ' + ', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
