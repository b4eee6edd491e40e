"""Every C layout vmgpu's Python mirrors (vmgpu/abi.py) against its header: a C program printing
offsetof and sizeof of every field, and each header constant, is compiled and compared with the
Python structures.  The shared-memory pages are also covered byte for byte by named fields, so a
field added on the C side alone shows as well as one moved."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vmgpu import abi

pytestmark = pytest.mark.native

INCLUDE = ROOT / "native" / "shm_transport" / "include"
LAYOUTS = {**abi.PAGES, **abi.ARGUMENTS}


def c_program(layouts: dict, constants: dict) -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += [f"#include <{h}>" for h in layouts]
    lines.append("int main(void)\n{")
    for classes in layouts.values():
        for cls in classes:
            st = f"struct {cls.c_struct}"
            lines.append(f'\tprintf("{cls.c_struct} %zu\\n", sizeof({st}));')
            for name, *_ in cls._fields_:
                where = f"offsetof({st}, {name}), sizeof((({st} *)0)->{name})"
                lines.append(f'\tprintf("{cls.c_struct}.{name} %zu %zu\\n", {where});')
    for name, value in constants.items():
        if isinstance(value, str):
            lines.append(f'\tprintf("{name} %s\\n", {name});')
        else:
            lines.append(f'\tprintf("{name} %llu\\n", (unsigned long long)({name}));')
    lines.append("\treturn 0;\n}")
    return "\n".join(lines) + "\n"


def c_layouts(tmp_path: Path, include: Path = INCLUDE) -> dict[str, str]:
    """What the C compiler says: 'struct' -> 'size', 'struct.field' -> 'offset size', constants."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to check the layouts with")
    src, exe = tmp_path / "layouts.c", tmp_path / "layouts"
    src.write_text(c_program(LAYOUTS, abi.CONSTANTS))
    r = subprocess.run([cc, "-std=gnu11", "-I", str(include), "-o", str(exe), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, "the layouts do not compile against the headers:\n" + r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def python_layouts() -> dict[str, str]:
    """The same, as vmgpu/abi.py lays it out."""
    out = {}
    for classes in LAYOUTS.values():
        for cls in classes:
            out[cls.c_struct] = str(ctypes.sizeof(cls))
            for name, *_ in cls._fields_:
                f = getattr(cls, name)
                out[f"{cls.c_struct}.{name}"] = f"{f.offset} {f.size}"
    for name, value in abi.CONSTANTS.items():
        out[name] = str(value)
    return out


def differences(c: dict, py: dict) -> list[str]:
    return [
        f"{k}: C says {c.get(k)}, vmgpu/abi.py says {py.get(k)}"
        for k in sorted(set(c) | set(py))
        if c.get(k) != py.get(k)
    ]


def test_every_mirrored_field_and_constant_is_where_the_c_headers_put_it(tmp_path):
    assert differences(c_layouts(tmp_path), python_layouts()) == []


@pytest.mark.parametrize("cls", [c for classes in abi.PAGES.values() for c in classes], ids=lambda c: c.c_struct)
def test_every_byte_of_a_shared_page_belongs_to_a_named_field(cls):
    """No implicit padding: a field the C side adds alone cannot hide in a gap."""
    end = 0
    for name, *_ in cls._fields_:
        f = getattr(cls, name)
        assert f.offset == end, f"{cls.c_struct}: a gap before {name} ({end}..{f.offset})"
        end = f.offset + f.size
    assert end == ctypes.sizeof(cls)


def test_a_field_moved_in_a_c_header_alone_is_caught(tmp_path):
    """sched_abi.h with a slot's weight and waiters swapped (and its own asserts taken out, to show
    that this test does not lean on them): the comparison names both fields."""
    include = tmp_path / "include"
    shutil.copytree(INCLUDE, include)
    header = include / "vmgpu" / "sched_abi.h"
    text = header.read_text()
    weight = re.search(r"^.*\) weight;.*\n", text, re.M)[0]
    waiters = re.search(r"^.*\) waiters;.*\n", text, re.M)[0]
    text = text.replace(weight + waiters, waiters + weight)
    header.write_text(re.sub(r"^_Static_assert\(.*\n", "", text, flags=re.M))
    diff = differences(c_layouts(tmp_path, include), python_layouts())
    assert [d.split(":")[0] for d in diff] == ["vmgpu_sched_slot.waiters", "vmgpu_sched_slot.weight"], diff


def test_a_field_moved_in_the_python_mirror_alone_is_caught(tmp_path):
    fields = list(abi.StatsPage._fields_)
    fields[1], fields[2] = fields[2], fields[1]  # version and ndev
    moved = type("StatsPage", (ctypes.Structure,), {"_fields_": fields, "c_struct": "vmgpu_stats_page"})
    py = python_layouts()
    for name, *_ in fields:
        py[f"vmgpu_stats_page.{name}"] = f"{getattr(moved, name).offset} {getattr(moved, name).size}"
    diff = differences(c_layouts(tmp_path), py)
    assert [d.split(":")[0] for d in diff] == ["vmgpu_stats_page.ndev", "vmgpu_stats_page.version"], diff
