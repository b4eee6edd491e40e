"""vmgpu's CUDA driver API generator: api.toml in, both sides' C and the Python opcode table out.

spec.py loads and checks the spec; c_common.py, guest.py, host.py and python_ops.py emit;
gen.py (beside this package) is the command line.
"""

from __future__ import annotations

import os

from .c_common import emit_guest_protos, emit_handles, emit_host_protos, emit_ops, emit_proto_ops, emit_sizes
from .exports import emit_exports, load_exports
from .guest import emit_errors, emit_guest, emit_map, emit_procaddr, emit_stubs
from .host import emit_backend, emit_host
from .python_ops import emit_py_ops
from .spec import CUDA_API_DIR, SpecError, load

__all__ = ["CUDA_API_DIR", "SpecError", "generate"]


def generate(
    include_dir: str,
    spec_path: str = os.path.join(CUDA_API_DIR, "api.toml"),
    exports_path: str = os.path.join(CUDA_API_DIR, "export_tables.toml"),
) -> dict[str, str]:
    """Every generated file's text, by its path relative to generated/."""
    spec, funcs, exports, served, protos, handles, extra, protocol = load(include_dir, spec_path)
    return {
        "vg_ops.h": emit_ops(funcs),
        "../include/vg_proto_ops.h": emit_proto_ops(protocol),
        "vg_kinds.h": emit_handles(handles),
        "vg_sizes.h": emit_sizes(spec.get("sizes", {})),
        "vg_export_layouts.h": emit_exports(load_exports(exports_path)),
        "vg_guest_protos.h": emit_guest_protos(funcs),
        "vh_protos.h": emit_host_protos(funcs),
        "guest_entries.c": emit_guest(funcs, handles),
        "guest_stubs.c": emit_stubs(exports, served),
        "guest_procaddr.c": emit_procaddr(exports),
        "libcuda.map": emit_map(exports),
        "host_dispatch.c": emit_host(funcs, handles),
        "vh_backend_fns.h": emit_backend(funcs, extra),
        "vg_errors.c": emit_errors(include_dir),
        "../../../vmgpu/cuda_ops.py": emit_py_ops(funcs, protocol),
    }
