"""The guest library's generated C: entry points, stubs, cuGetProcAddress rows, the export map, error names."""

from __future__ import annotations

import os
import re

from .c_common import BANNER, bounds_checks, proto
from .spec import CUDA_API_DIR, Func, SpecError


def guest_entry(fn: Func, handles: dict[str, str]) -> list[str]:
    """The guest entry point of a sync or async function: marshal, send, unmarshal."""
    s = fn.spec
    outs = set(s.get("out", []))
    ins = set(s.get("in", []))
    inouts = set(s.get("inout", []))
    strs = set(s.get("in_string", []))
    in_arr = s.get("in_array", {})
    out_arr = s.get("out_array", {})
    in_sized = s.get("in_sized", {})
    out_sized = s.get("out_sized", {})
    sel_type = {p.name: p.ctype for p in fn.params}
    size_of = lambda n, sel: f"vg_size_{sel_type[sel]}({sel})"  # noqa: E731
    body = [
        f"{'' if fn.spec.get('guest') in ('cached', 'front') else 'static '}CUresult forward_{fn.name}({', '.join([f'{p.ctype} {p.name}' for p in fn.params] + ['unsigned vg_flags'])})",
        "{",
    ]
    counted = s.get("counted_out", {})
    counts = {c: a for a, c in counted.items()}
    addresses = set(s.get("address", []))
    body += bounds_checks(s.get("bounds", {}))  # before any array the value counts is read
    for n in [*in_sized, *out_sized, *s.get("required", []), *counted.values()]:  # a sized value needs its buffer
        body.append(f"\tif ({n} == NULL)\n\t\treturn CUDA_ERROR_INVALID_VALUE;")
    configs = s.get("launch_config", [])
    for n in configs:
        body.append(
            f"\tif ({n} == NULL || ({n}->numAttrs && {n}->attrs == NULL))\n\t\treturn CUDA_ERROR_INVALID_VALUE;"
        )
    body += [
        "\tstruct vg_call c;",
        f"\tCUresult r = vg_begin(&c, VG_OP_{fn.name}, vg_flags);",
        "\tif (r != CUDA_SUCCESS)\n\t\treturn r;",
    ]
    for p in fn.params:
        if p.name in outs:
            body.append(f"\tvg_put_u64(&c, {p.name} != NULL);")
        elif p.name in ins or p.name in inouts:
            body.append(f"\tvg_put_opt(&c, {p.name}, sizeof(*{p.name}));")
        elif p.name in strs:
            body.append(f"\tvg_put_str(&c, {p.name});")
        elif p.name in in_arr:
            body.append(f"\tvg_put_arr(&c, {p.name}, (uint64_t)({in_arr[p.name]}), sizeof(*{p.name}));")
        elif p.name in out_arr:
            body.append(f"\tvg_put_u64(&c, {p.name} != NULL ? (uint64_t)({out_arr[p.name]}) : 0);")
        elif p.name in in_sized:
            body.append(f"\tvg_put_arr(&c, {p.name}, {size_of(p.name, in_sized[p.name])}, 1);")
        elif p.name in out_sized:
            continue  # the host sizes it by the same table
        elif p.name in configs:
            body.append(f"\tvg_put_launch_config(&c, {p.name});")
        elif p.name in counted:  # the capacity; 0: the count alone is asked for
            body.append(f"\tvg_put_u64(&c, {p.name} != NULL ? (uint64_t)*{counted[p.name]} : 0);")
        elif p.name in counts:
            continue
        elif p.name in addresses:  # a device address as the program gave it; the host checks it
            body.append(f"\tvg_put_u64(&c, (uint64_t)(uintptr_t){p.name});")
        elif p.ctype == "CUcontext":
            body.append(f"\tvg_put_ctx(&c, {p.name});")
        elif p.ctype == "CUfunction":
            body.append(f"\tvg_put_u64(&c, vg_function_handle({p.name}));")
        else:
            if p.is_pointer:
                raise SpecError(f"{fn.name}: pointer parameter {p.name} has no marshalling")
            body.append(f"\tvg_put(&c, &{p.name}, sizeof({p.name}));")
    if fn.cls == "async":
        body.append("\treturn vg_send_async(&c);")
    else:
        body.append("\tr = vg_call_sync(&c);")
        if outs or out_arr or inouts or out_sized or counted:
            body.append("\tif (r == CUDA_SUCCESS) {")
            for p in fn.params:
                if p.name in outs or p.name in inouts:
                    body.append(f"\t\tif ({p.name} != NULL)\n\t\t\tvg_get(&c, {p.name}, sizeof(*{p.name}));")
                elif p.name in out_arr:
                    body.append(
                        f"\t\tif ({p.name} != NULL)\n\t\t\tvg_get(&c, {p.name}, (uint64_t)({out_arr[p.name]}) * sizeof(*{p.name}));"
                    )
                elif p.name in out_sized:
                    body.append(f"\t\tvg_get(&c, {p.name}, {size_of(p.name, out_sized[p.name])});")
                elif p.name in counted:
                    # the total, then the elements given (never more than the capacity)
                    cnt = counted[p.name]
                    body.append(f"\t\tuint64_t {p.name}_total = vg_get_u64(&c), {p.name}_got = vg_get_u64(&c);")
                    body.append(f"\t\tif ({p.name} != NULL && {p.name}_got <= *{cnt})")
                    body.append(f"\t\t\tvg_get(&c, {p.name}, {p.name}_got * sizeof(*{p.name}));")
                    body.append(f"\t\t*{cnt} = {p.name} != NULL ? {p.name}_got : {p.name}_total;")
            body.append("\t}")
        body.append("\treturn vg_end(&c, r);")
    body.append("}\n")
    return body


def emit_guest(funcs: list[Func], handles: dict[str, str]) -> str:
    lines = [BANNER, '#include "vg_guest.h"\n#include "vg_guest_protos.h"\n#include "vg_sizes.h"\n']
    args = lambda f: ", ".join(p.name for p in f.params)  # noqa: E731
    for fn in funcs:
        if fn.cls in ("sync", "async"):
            lines += guest_entry(fn, handles)
            target = f"forward_{fn.name}"
            if fn.spec.get("guest") in ("cached", "front"):
                # answered from a hand-written guest cache, which calls forward_<name> on a miss
                target = f"handwritten_{fn.name}"
        else:
            target = f"handwritten_{fn.name}"
        for name, flag in [(fn.name, "0")] + [(v, "VG_F_PTDS") for v in fn.variants]:
            lines.append(
                f"VG_EXPORT {proto(name, fn.params)}\n{{\n\treturn {target}({args(fn) + ', ' if fn.params else ''}{flag});\n}}\n"
            )
    return "\n".join(lines)


def emit_stubs(exports: list[str], served: set[str]) -> str:
    lines = [
        BANNER,
        "/* Every driver export vmgpu does not serve: CUDA_ERROR_NOT_SUPPORTED, logged once. */",
        '#include "vg_stub.h"\n',
    ]
    for name in exports:
        if name not in served:
            lines.append(f"VG_STUB({name})")
    return "\n".join(lines) + "\n"


def read_procaddr(path: str = os.path.join(CUDA_API_DIR, "driver", "procaddr.tsv")) -> tuple[str, list]:
    """The probed driver's cuGetProcAddress answers: its version line, and rows (base name, flags,
    version asked, answer: a symbol, `!rc/status` or `?` for an unexported internal function)."""
    rows = []
    driver = ""
    with open(path) as f:
        for ln in f:
            if ln.startswith("#"):
                driver = ln[1:].strip()
                continue
            base, flag, ver, ans = ln.rstrip("\n").split("\t")
            rows.append((base if base != "-" else "", int(flag), int(ver), ans))
    return driver, rows


def emit_procaddr(exports: list[str]) -> str:
    driver, rows = read_procaddr()
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    lines = [
        BANNER,
        f"/* cuGetProcAddress as answered by the probed driver: {driver}. */",
        '#include "vg_procaddr.h"\n',
    ]
    for name in sorted({r[3] for r in rows if not r[3].startswith(("!", "?"))}):
        if name not in exports:
            raise SpecError(f"procaddr answer {name} is not an export")
        lines.append(f"extern char {name}[];")
    lines.append("\nconst struct vg_procaddr_row vg_procaddr_rows[] = {")
    for base, flag, ver, ans in rows:
        if ans.startswith("!"):
            rc, st = ans[1:].split("/")
            lines.append(f'\t{{"{base}", {flag}, {ver}, NULL, {rc}, {st}}},')
        elif ans.startswith("?"):
            # an unexported driver-internal function: not something a guest can be given
            lines.append(f'\t{{"{base}", {flag}, {ver}, NULL, 500, 1}},')
        else:
            lines.append(f'\t{{"{base}", {flag}, {ver}, (void *){ans}, 0, 0}},')
    lines.append("};\nconst unsigned vg_procaddr_nrows = sizeof(vg_procaddr_rows) / sizeof(vg_procaddr_rows[0]);")
    m = re.match(r"driver (\d+)", driver)
    if not m:
        raise SpecError("procaddr.tsv: first line must name the driver version")
    lines.append(f"const int vg_probed_driver_version = {m.group(1)};")
    return "\n".join(lines) + "\n"


def emit_map(exports: list[str]) -> str:
    body = "".join(f"\t\t{n};\n" for n in exports)
    return f"/* Generated by native/cuda_api/gen.py; do not edit. */\n{{\n\tglobal:\n{body}\tlocal:\n\t\t*;\n}};\n"


def emit_errors(include_dir: str) -> str:
    text = open(os.path.join(include_dir, "cuda.h")).read()
    enum = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", text, re.S)
    if not enum:
        raise SpecError("cuda.h: enum cudaError_enum not found")
    rows = re.findall(r"\b(CUDA_(?:SUCCESS|ERROR_\w+))\s*=\s*(\d+)", enum.group(1))
    lines = [BANNER, '#include "vg_errors.h"\n', "const struct vg_error_name vg_error_names[] = {"]
    for name, code in rows:
        words = name.removeprefix("CUDA_ERROR_").removeprefix("CUDA_").lower().replace("_", " ")
        lines.append(f'\t{{{code}, "{name}", "{words}"}},')
    lines.append("};\nconst unsigned vg_error_nnames = sizeof(vg_error_names) / sizeof(vg_error_names[0]);")
    return "\n".join(lines) + "\n"
