"""export_tables.toml: the driver's private export tables the guest serves or refuses, checked
against the probed driver (driver/export_tables.txt), emitted as generated/vg_export_layouts.h."""

from __future__ import annotations

import os
import re
import tomllib

from .c_common import BANNER
from .spec import CUDA_API_DIR, SpecError

RESULTS = ("CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_SUPPORTED")


def uuid_bytes(name: str, text: str) -> list[int]:
    hexid = text.replace("-", "")
    if not re.fullmatch(r"[0-9a-f]{32}", hexid):
        raise SpecError(f"export table {name}: uuid {text!r} is not 16 hex bytes")
    return list(bytes.fromhex(hexid))


def probed_lengths() -> dict[str, int]:
    """The probed driver's tables (by uuid): the size word's count, or the entries before a NULL."""
    out = {}
    with open(os.path.join(CUDA_API_DIR, "driver", "export_tables.txt")) as f:
        for ln in f:
            cols = ln.rstrip("\n").split("\t")
            if len(cols) < 3 or cols[1] != "rc=0":
                continue
            words = cols[2].split()
            out[cols[0]] = int(words[0], 16) // 8 if words[0].startswith("0x") else words.index("0")
    return out


def load_exports(path: str = os.path.join(CUDA_API_DIR, "export_tables.toml")) -> list[dict]:
    with open(path, "rb") as f:
        tables = tomllib.load(f).get("table", {})
    probed = probed_lengths()
    nvml = open(os.path.join(CUDA_API_DIR, "include", "vg_nvml_table.h")).read()
    out, seen = [], {}
    for name, t in tables.items():
        if not re.fullmatch(r"\w+", name):
            raise SpecError(f"export table {name!r}: the name must be a C identifier's characters")
        u = uuid_bytes(name, t.get("uuid", ""))
        if bytes(u) in seen:
            raise SpecError(f"export table {name}: uuid already used by {seen[bytes(u)]}")
        seen[bytes(u)] = name
        kinds = [k for k in ("slots", "refuse", "object") if k in t]
        if len(kinds) != 1:
            raise SpecError(f"export table {name}: needs exactly one of slots, refuse, object")
        e = {**t, "name": name, "uuid": u}
        if "refuse" in t and t["refuse"] not in RESULTS:
            raise SpecError(f"export table {name}: refuse must be one of {', '.join(RESULTS)}")
        if "object" in t:
            m = re.search(r"#define VG_NVML_TABLE_UUID \\\s*\{([^}]*)\}", nvml)
            if t["object"] != "vg_nvml_table" or not m or [int(x, 16) for x in m.group(1).split(",")] != u:
                raise SpecError(f"export table {name}: the object is vg_nvml_table, by VG_NVML_TABLE_UUID's uuid")
        if "slots" in t:
            check_slots(name, e, probed.get(t["uuid"]))
        out.append(e)
    return out


def check_slots(name: str, e: dict, driver: int | None) -> None:
    n = e["slots"]
    size_word = e.get("size_word", True)
    known = {int(k): v for k, v in e.get("known", {}).items()}
    null = set(e.get("null", []))
    if not isinstance(n, int) or not 1 <= n <= 1024 or "in" not in e:
        raise SpecError(f"export table {name}: slots (1..1024) and the file it is `in` are needed")
    for k, fn in known.items():
        if not 0 <= k < n or (k == 0 and size_word) or k in null or not re.fullmatch(r"[a-z_]\w*", fn):
            raise SpecError(f"export table {name}: known slot {k} = {fn!r} is not a slot of its own")
    if any(k < n for k in null) and size_word:
        raise SpecError(f"export table {name}: a NULL inside the size word's slots would be jumped through")
    unknown = [k for k in range(1 if size_word else 0, n) if k not in known and k not in null]
    if unknown and not re.fullmatch(r"[a-z_]\w*", e.get("log", "")):
        raise SpecError(f"export table {name}: unexplained slots need a `log` name")
    if driver is not None and n != driver and e.get("driver_slots") != driver:
        raise SpecError(
            f"export table {name}: {n} slots, the probed driver's has {driver}"
            f" (set driver_slots = {driver} if serving fewer is meant)"
        )
    e["_known"], e["_null"], e["_unknown"] = known, null, unknown
    e["_length"] = max([n, *(k + 1 for k in null)])


def emit_exports(tables: list[dict]) -> str:
    served = [t for t in tables if "slots" in t]
    lines = [
        BANNER.replace("api.toml", "export_tables.toml"),
        "/* The export tables' layouts, from export_tables.toml: the file that holds a table's slot",
        " * functions expands VG_EXPORT_TABLE_<NAME> (an unexplained slot: VG_UNKNOWN_SLOT, export_tables.h);",
        " * cuGetExportTable looks a UUID up in VG_EXPORT_TABLES (T: served, O: an object, R: refused;",
        " * each row: name, what, then the UUID's 16 bytes). */",
        "#ifndef VG_EXPORT_LAYOUTS_H\n#define VG_EXPORT_LAYOUTS_H\n",
        "enum vg_export_table_id {",
    ]
    lines += [f"\tVG_EXPORT_ID_{t['name']}," for t in served]
    lines.append("\tVG_EXPORT_ID_COUNT,\n};\n")
    for t in served:
        sym = f"vg_export_{t['name'].lower()}"
        lines.append(f"extern const vg_slot {sym}[{t['_length']}];")
    for t in served:
        sym, n = f"vg_export_{t['name'].lower()}", t["slots"]
        lines.append(
            f"\n/* {t['name']} ({t['in']}): {n} slots{', slot 0 its size' if t.get('size_word', True) else ''} */"
        )
        lines.append(f"#define VG_EXPORT_TABLE_{t['name']} \\")
        lines += [f"\tVG_UNKNOWN_SLOT({t['log']}, VG_EXPORT_ID_{t['name']}, {k}) \\" for k in t["_unknown"]]
        lines.append(f"\tconst vg_slot {sym}[{t['_length']}] = {{ \\")
        for k in range(t["_length"]):
            if k == 0 and t.get("size_word", True):
                v = f"(vg_slot)(uintptr_t)({n} * sizeof(void *))"
            elif k in t["_known"]:
                v = f"(vg_slot){t['_known'][k]}"
            elif k in t["_unknown"]:
                v = f"(vg_slot)unknown_{t['log']}_{k}"
            else:
                v = "NULL"
            lines.append(f"\t\t[{k}] = {v}, \\")
        lines.append("\t};")
    lines.append("\n#define VG_EXPORT_TABLES(T, O, R) \\")
    for t in tables:
        u = ", ".join(f"0x{b:02x}" for b in t["uuid"])  # last: the uuid's 16 bytes
        if "slots" in t:
            lines.append(f'\tT("{t["name"]}", vg_export_{t["name"].lower()}, {u}) \\')
        elif "object" in t:
            lines.append(f'\tO("{t["name"]}", {t["object"]}, {u}) \\')
        else:
            lines.append(f'\tR("{t["name"]}", {t["refuse"]}, {u}) \\')
    lines.append("\t/* end */\n\n#endif")
    return "\n".join(lines) + "\n"
