"""The host forwarder's generated C: the dispatch switch and the list of driver functions it calls."""

from __future__ import annotations

from .c_common import BANNER, bounds_checks, kind_of
from .spec import Func, SpecError, device_size


def host_case(fn: Func, handles: dict[str, str]) -> list[str]:
    s = fn.spec
    outs = s.get("out", [])
    ins = set(s.get("in", []))
    inouts = set(s.get("inout", []))
    strs = set(s.get("in_string", []))
    in_arr = s.get("in_array", {})
    out_arr = s.get("out_array", {})
    in_sized = s.get("in_sized", {})
    out_sized = s.get("out_sized", {})
    nonnull = set(s.get("nonnull", []))
    configs = s.get("launch_config", [])
    counted = s.get("counted_out", {})
    counts = {c: a for a, c in counted.items()}
    sel_type = {p.name: p.ctype for p in fn.params}
    addresses = set(s.get("address", []))
    b = [f"\tcase VG_OP_{fn.name}: {{"]
    for p in fn.params:
        if p.name in outs:
            b.append(f"\t\t{p.pointee} {p.name}_v;\n\t\tmemset(&{p.name}_v, 0, sizeof({p.name}_v));")
            b.append(f"\t\t{p.pointee} *{p.name} = vh_get_u64(rd) ? &{p.name}_v : NULL;")
        elif p.name in ins or p.name in inouts:
            b.append(
                f"\t\t{p.pointee} {p.name}_v;\n\t\t{p.ctype}{p.name} = vh_get_opt(rd, &{p.name}_v, sizeof({p.name}_v));"
            )
        elif p.name in strs:
            b.append(f"\t\tconst char *{p.name} = vh_get_str(rd);")
        elif p.name in addresses:  # a guest device address, for the guarded half to check
            b.append(f"\t\t{p.ctype}{p.name} = (void *)(uintptr_t)vh_get_u64(rd);")
        elif p.name in in_arr:
            b.append(
                f"\t\tuint64_t {p.name}_n;\n\t\t{p.ctype}{p.name} = vh_get_arr(rd, sizeof({p.pointee}), &{p.name}_n);"
            )
        elif p.name in out_arr:
            b.append(f"\t\tuint64_t {p.name}_n = vh_get_u64(rd);")
            b.append(f"\t\t{p.ctype}{p.name} = {p.name}_n ? vh_scratch(ch, {p.name}_n, sizeof({p.pointee})) : NULL;")
        elif p.name in counted:
            b.append(f"\t\tuint64_t {p.name}_cap = vh_get_u64(rd);")
        elif p.name in counts:
            continue
        elif p.name in configs:
            # dims, stream and attributes, the attributes' events translated (launch.c)
            b.append(f"\t\tCUlaunchConfig {p.name}_v;\n\t\tCUlaunchAttribute {p.name}_attrs[VG_MAX_LAUNCH_ATTRS];")
            b.append(f"\t\tCUresult {p.name}_r = vh_launch_config_in(ch, vg_flags, rd, &{p.name}_v, {p.name}_attrs);")
            b.append(f"\t\t{p.ctype}{p.name} = &{p.name}_v;")
        elif p.name in in_sized or p.name in out_sized:
            # a private, aligned buffer of the largest size the table allows
            t = sel_type[in_sized.get(p.name) or out_sized[p.name]]
            b.append(
                f"\t\tuint64_t {p.name}_v[(VG_SIZE_MAX_{t} + 7) / 8] = {{0}};\n\t\t{p.ctype}{p.name} = {p.name}_v;"
            )
            if p.name in in_sized:
                b.append(f"\t\tuint64_t {p.name}_n;\n\t\tconst void *{p.name}_in = vh_get_arr(rd, 1, &{p.name}_n);")
        else:
            if p.is_pointer:  # never let a guest-supplied value reach the driver as a pointer
                raise SpecError(f"{fn.name}: pointer parameter {p.name} has no host-side decoding")
            b.append(f"\t\t{p.ctype} {p.name};\n\t\tvh_get(rd, &{p.name}, sizeof({p.name}));")
            k = kind_of(p.ctype, handles)
            if p.name in nonnull:
                b.append(f"\t\tif ({p.name} == NULL)\n\t\t\treturn CUDA_ERROR_INVALID_HANDLE;")
            if k:
                b.append(
                    f"\t\tif (vh_handle_in(ch, VG_KIND_{k.upper()}, (void **)&{p.name}))\n\t\t\treturn CUDA_ERROR_INVALID_HANDLE;"
                )
            elif p.ctype == "CUdevice":
                b.append(f"\t\tif (vh_device_in(ch, &{p.name}))\n\t\t\treturn CUDA_ERROR_INVALID_DEVICE;")
            elif p.ctype == "CUcontext":
                b.append(f"\t\tif (vh_context_in(ch, &{p.name}))\n\t\t\treturn CUDA_ERROR_INVALID_CONTEXT;")
    b.append("\t\tif (rd->bad)\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;")
    b += bounds_checks(s.get("bounds", {}), "\t\t")  # before the counts they give
    for p in fn.params:
        if p.name in in_arr and p.name in s.get("nullable", []):  # none given: NULL, whatever the count
            b.append(
                f"\t\tif ({p.name}_n == 0)\n\t\t\t{p.name} = NULL;\n\t\telse if ({p.name}_n != (uint64_t)({in_arr[p.name]}))\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;"
            )
        elif p.name in in_arr:
            b.append(f"\t\tif ({p.name}_n != (uint64_t)({in_arr[p.name]}))\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;")
            b += handle_array_in(p, handles)
        if p.name in out_arr:
            b.append(
                f"\t\tif ({p.name}_n && ({p.name} == NULL || {p.name}_n != (uint64_t)({out_arr[p.name]})))\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;"
            )
    for n in configs:
        b.append(f"\t\tif ({n}_r != CUDA_SUCCESS)\n\t\t\treturn {n}_r;")
    for n in s.get("required", []):
        b.append(f"\t\tif ({n} == NULL)\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;")
    for n, sel in [*in_sized.items(), *out_sized.items()]:
        b.append(f"\t\tsize_t {n}_sz = vg_size_{sel_type[sel]}({sel});")
        b.append(f"\t\tif ({n}_sz == 0)\n\t\t\treturn CUDA_ERROR_NOT_SUPPORTED;")
        if n in in_sized:
            b.append(f"\t\tif ({n}_n != {n}_sz)\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;")
            b.append(f"\t\tmemcpy({n}_v, {n}_in, {n}_sz);")
    for n, size in s.get("device", {}).items():
        count, k = device_size(fn, size)
        b.append(f"\t\tif (vh_dev_range(ch, {n}, (uint64_t)({count}), {k}))\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;")
    call_args = ", ".join(p.name for p in fn.params)
    if counted:
        return b + counted_call(fn, counted, handles) + ["\t}"]
    if s.get("host") == "custom":
        b.append(f"\t\tCUresult r = guarded_{fn.name}(ch{', ' + call_args if call_args else ''});")
    else:
        b.append(
            f"\t\tCUresult r = (vg_flags & VG_F_PTDS) && B->{fn.name}_pt ? B->{fn.name}_pt({call_args}) : B->{fn.name}({call_args});"
            if fn.variants
            else f"\t\tCUresult r = B->{fn.name}({call_args});"
        )
    b.append("\t\tif (r != CUDA_SUCCESS)\n\t\t\treturn r;")
    d = s.get("destroys")
    if d:
        k = handles[next(p.ctype for p in fn.params if p.name == d)]
        b.append(f"\t\tvh_handle_drop(ch, VG_KIND_{k.upper()}, {d});")
    parent = s.get("parent")  # a handle that dies with this one's parent (a module's functions)
    for p in fn.params:
        if p.name in outs:
            k = kind_of(p.pointee, handles)
            if k:
                b.append(
                    f"\t\tif ({p.name} != NULL && vh_handle_new(ch, VG_KIND_{k.upper()}, (void **){p.name}, {parent or 'NULL'}))\n\t\t\treturn CUDA_ERROR_OUT_OF_MEMORY;"
                )
    for p in fn.params:
        if p.name in outs or p.name in inouts:
            b.append(f"\t\tif ({p.name} != NULL)\n\t\t\tvh_put(wr, {p.name}, sizeof(*{p.name}));")
        elif p.name in out_arr:
            b.append(f"\t\tif ({p.name} != NULL)\n\t\t\tvh_put(wr, {p.name}, {p.name}_n * sizeof(*{p.name}));")
        elif p.name in out_sized:
            b.append(f"\t\tvh_put(wr, {p.name}, {p.name}_sz);")
    b.append("\t\treturn CUDA_SUCCESS;\n\t}")
    return b


def handle_array_in(p, handles: dict[str, str]) -> list[str]:
    """An in_array of handles (a graph node's dependencies): each element translated through the
    guest's table in place, in the request's own copy (the worker's memory, copied out of the ring:
    the guest cannot change it after the check), none NULL; the driver sees only that."""
    k = kind_of(p.pointee, handles)
    if not k:
        return []
    n = p.name
    return [
        f"\t\t{p.pointee} *{n}_h = ({p.pointee} *)(uintptr_t){n};",
        f"\t\tfor (uint64_t i = 0; i < {n}_n; i++) {{",
        f"\t\t\tif ({n}_h[i] == NULL || vh_handle_in(ch, VG_KIND_{k.upper()}, (void **)&{n}_h[i]))",
        "\t\t\t\treturn CUDA_ERROR_INVALID_HANDLE;",
        "\t\t}",
        f"\t\t{n} = {n}_h;",
    ]


def counted_call(fn: Func, counted: dict[str, str], handles: dict[str, str]) -> list[str]:
    """An array the driver fills up to a count, or whose count alone it gives when the array is
    NULL: asked for the total first, so that what the host sets aside is bounded by what exists
    (never by the capacity the guest claims) and by what the reply can carry; the reply is the
    total, the number given, then the elements (new handles where they are handles)."""
    ((arr, cnt),) = counted.items()
    p = next(p for p in fn.params if p.name == arr)
    args = lambda a, c: ", ".join(a if q.name == arr else c if q.name == cnt else q.name for q in fn.params)  # noqa: E731
    b = [
        f"\t\tsize_t {arr}_total = 0;",
        f"\t\tCUresult r = B->{fn.name}({args('NULL', f'&{arr}_total')});",
        "\t\tif (r != CUDA_SUCCESS)\n\t\t\treturn r;",
        f"\t\tuint64_t {arr}_want = {arr}_cap < {arr}_total ? {arr}_cap : {arr}_total;",
        f"\t\tif ({arr}_want > (wr->cap - wr->len) / sizeof({p.pointee}) - 2)\n\t\t\treturn CUDA_ERROR_INVALID_VALUE;",
        f"\t\t{p.pointee} *{arr} = {arr}_want ? vh_scratch(ch, {arr}_want, sizeof(*{arr})) : NULL;",
        f"\t\tsize_t {arr}_got = {arr}_want;",
        f"\t\tif ({arr}_want && (!{arr} || (r = B->{fn.name}({args(arr, f'&{arr}_got')})) != CUDA_SUCCESS))",
        f"\t\t\treturn {arr} ? r : CUDA_ERROR_OUT_OF_MEMORY;",
        f"\t\tif ({arr}_got > {arr}_want)\n\t\t\treturn CUDA_ERROR_UNKNOWN;",
        f"\t\tuint64_t {arr}_head[2] = {{{arr}_total, {arr}_got}};",
        f"\t\tvh_put(wr, {arr}_head, sizeof({arr}_head));",
    ]
    k = kind_of(p.pointee, handles)
    if k:
        parent = fn.spec.get("parent")
        b.append(f"\t\tfor (size_t i = 0; i < {arr}_got; i++)")
        b.append(
            f"\t\t\tif (vh_handle_new(ch, VG_KIND_{k.upper()}, (void **)&{arr}[i], {parent or 'NULL'}))\n\t\t\t\treturn CUDA_ERROR_OUT_OF_MEMORY;"
        )
    b.append(f"\t\tif ({arr}_got)\n\t\t\tvh_put(wr, {arr}, {arr}_got * sizeof(*{arr}));")
    b.append("\t\treturn wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;")
    return b


def emit_host(funcs: list[Func], handles: dict[str, str]) -> str:
    lines = [BANNER, '#include "vh_dispatch.h"\n#include "vh_protos.h"\n#include "vg_sizes.h"\n']
    lines.append(
        "\nCUresult vh_dispatch(struct vh_chan *ch, uint32_t op, uint32_t vg_flags, struct vh_rd *rd, struct vh_wr *wr)\n{"
    )
    lines.append("\tconst struct vh_backend *B = ch->backend;\n\t(void)B;\n\tswitch (op) {")
    for fn in funcs:
        if fn.cls in ("sync", "async"):
            lines += host_case(fn, handles)
        elif fn.cls == "custom":
            lines.append(f"\tcase VG_OP_{fn.name}:\n\t\treturn handwritten_{fn.name}(ch, vg_flags, rd, wr);")
    lines.append("\tdefault:\n\t\treturn vh_dispatch_proto(ch, op, vg_flags, rd, wr);\n\t}\n}\n")
    lines += op_set("vh_op_reports_async", "", [f for f in funcs if f.spec.get("reports_async")])
    lines += op_set(
        "vh_op_gpu_work",
        "\n/* Calls that put work on the GPU: the compute scheduler gates them (sched_page.c). */",
        [f for f in funcs if f.spec.get("gpu_work")],
    )
    lines += op_set(
        "vh_op_gpu_stream",
        "\n/* Of those, the calls that name the stream their work goes to (a CUstream, or a launch"
        "\n * configuration's): the GPU of that stream, not the current one, gates them (serve.c). */",
        [f for f in funcs if f.spec.get("gpu_work") and names_stream(f)],
    )
    lines += op_set(
        "vh_op_async",
        "\n/* Calls of the async class (api.toml): what they do is queued on a stream, as work is (an"
        "\n * event recorded, a wait for one); a blocking stream's order covers them (partition.c). */",
        [f for f in funcs if f.cls == "async"],
    )
    return "\n".join(lines) + "\n"


def op_set(name: str, comment: str, members: list[Func]) -> list[str]:
    """int name(uint32_t op): 1 for the members' operations, 0 for any other (after comment, if any)."""
    return [
        *([comment] if comment else []),
        f"int {name}(uint32_t op)\n{{\n\tswitch (op) {{",
        *(f"\tcase VG_OP_{f.name}:" for f in members),
        "\t\treturn 1;\n\tdefault:\n\t\treturn 0;\n\t}\n}",
    ]


def names_stream(fn: Func) -> bool:
    return any(p.base == "CUstream" or p.base == "CUlaunchConfig *" for p in fn.params)


def emit_backend(funcs: list[Func], extra: list[str]) -> str:
    names, pts = [], []
    for fn in funcs:
        if fn.cls in ("sync", "async") and fn.spec.get("host") != "custom":
            names.append(fn.name)
            if fn.variants:
                pts.append((fn.name, fn.variants[0]))
    for n in extra:
        if n not in names:
            names.append(n)
    lines = [
        BANNER,
        "/* The driver functions the forwarder calls (what the real driver and the simulated backend",
        " * provide): those the generated dispatcher calls, then those the hand-written halves call",
        " * (`->cuName` in host_forwarder/native, found by gen.py).  X(name) per function, P(name,",
        " * variant) for the per-thread-default-stream variant a flagged request uses. */",
        "#define VH_BACKEND_FNS(X) \\",
    ]
    lines += [f"\tX({n}) \\" for n in names]
    lines.append("\n#define VH_BACKEND_PT_FNS(P) \\")
    lines += [f"\tP({a}, {b}) \\" for a, b in pts]
    lines.append("\t/* end */")
    return "\n".join(lines) + "\n"
