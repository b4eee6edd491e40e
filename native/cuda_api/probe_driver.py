#!/usr/bin/env python3
"""Probe a real NVIDIA driver for the facts the guest libcuda.so.1 is generated from.

Run on a machine with the driver (the GPU host), not in CI:

    python3 native/cuda_api/probe_driver.py OUT_DIR

It writes two files into OUT_DIR:

* ``libcuda_exports.txt``: every function symbol the driver's libcuda.so.1 exports, one per line.
* ``procaddr.tsv``: how ``cuGetProcAddress_v2`` answers, for every exported base name, every
  CUDA version in ``VERSIONS`` and each flag (0 default, 1 legacy stream, 2 per-thread stream).
  Only the versions where the answer changes are kept: ``base flag min_version answer``,
  where answer is the exported symbol the returned pointer belongs to, or ``!<result>/<status>``.
"""

import ctypes
import ctypes.util
import os
import re
import sys

VERSIONS = (
    [
        2000,
        2010,
        2020,
        2030,
        3000,
        3010,
        3020,
        4000,
        4010,
        4020,
        5000,
        5050,
        6000,
        6050,
        7000,
        7050,
        8000,
        9000,
        9010,
        9020,
        10000,
        10010,
        10020,
    ]
    + [11000 + 10 * i for i in range(9)]
    + [12000 + 10 * i for i in range(10)]
    + [13000, 13010, 13020]
)

SUFFIX = re.compile(r"(_v\d+)?(_ptds|_ptsz)?$")


class DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def exported_functions(path):
    """Function symbols in the dynamic symbol table, read from the ELF file itself."""
    import struct

    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2, "64-bit ELF expected"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], sh[9]):
            st_name, st_info, _o, st_shndx, _v, _s = struct.unpack_from("<IBBHQQ", data, off)
            if st_shndx == 0 or (st_info & 0xF) != 2:  # defined STT_FUNC only
                continue
            end = data.index(b"\0", strtab[4] + st_name)
            names.add(data[strtab[4] + st_name : end].decode())
    return sorted(names)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    cuda = ctypes.CDLL("libcuda.so.1")
    libdl = ctypes.CDLL(None)
    path = None
    info = DlInfo()
    addr = ctypes.cast(cuda.cuInit, ctypes.c_void_p)
    libdl.dladdr(addr, ctypes.byref(info))
    path = os.path.realpath(info.dli_fname.decode())
    exports = exported_functions(path)
    with open(os.path.join(out_dir, "libcuda_exports.txt"), "w") as f:
        f.write("".join(e + "\n" for e in exports))
    by_addr = {}
    for name in exports:
        a = ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value
        by_addr.setdefault(a, []).append(name)
    cuda.cuInit(0)
    ver = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(ver))
    gpa = cuda.cuGetProcAddress_v2
    gpa.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ]
    bases = sorted({SUFFIX.sub("", e) for e in exports if e.startswith("cu")} | {""})
    rows = []
    for base in bases:
        for flag in (0, 1, 2):
            last = None
            for v in VERSIONS:
                fn = ctypes.c_void_p()
                status = ctypes.c_int(-1)
                rc = gpa(base.encode(), ctypes.byref(fn), v, flag, ctypes.byref(status))
                if rc == 0 and fn.value:
                    names = by_addr.get(fn.value)
                    if names is None:
                        libdl.dladdr(fn, ctypes.byref(info))
                        answer = "?" + (info.dli_sname or b"unexported").decode()
                    else:
                        # several exported names can share one address; prefer the one named
                        # like the base
                        names = sorted(names, key=lambda n: (not n.startswith(base), len(n), n))
                        answer = names[0]
                else:
                    answer = f"!{rc}/{status.value}"
                if answer != last:
                    rows.append(f"{base or '-'}\t{flag}\t{v}\t{answer}\n")
                    last = answer
    with open(os.path.join(out_dir, "procaddr.tsv"), "w") as f:
        f.write(f"# driver {ver.value} {os.path.basename(path)}\n")
        f.write("".join(rows))
    print(f"driver {ver.value}: {len(exports)} exports, {len(bases)} bases, {len(rows)} rows")
    probe_export_tables(cuda, os.path.join(out_dir, "export_tables.txt"))


EXPORT_TABLES = [
    "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9",
    "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9",
    "a094798c-2e74-2e74-93f2-0800200c0a66",
    "42d85a81-23f6-cb47-8298-f6e78a3aecdc",
    "c693336e-1121-df11-a8c3-68f355d89593",
    "263e8860-7cd2-6143-92f6-bbd5006dfa7e",
    "d4082055-bde6-704b-8d34-ba123c66e1f2",
    "69a28e9f-2449-8b47-b030-c5da330ea4e9",
    "da9151d3-3ae6-cc41-a5c0-4f26d533e328",
    "21318c60-9714-3248-8ca6-41ff7324c8f2",
    "0ca50b8c-1004-929a-89a7-d0df10e77286",
    "195bcbf4-d67d-024a-acc5-1d29cea631ae",
    "b10541e1-f7c7-c74a-9f64-f223be99f1e2",
]


def probe_export_tables(cuda, path):
    """Record, per export-table UUID, the driver's answer and the first slots (sizes, NULLs)."""
    with open(path, "w") as f:
        for text in EXPORT_TABLES:
            raw = bytes.fromhex(text.replace("-", ""))
            uuid = (ctypes.c_ubyte * 16)(*raw)
            table = ctypes.c_void_p()
            rc = cuda.cuGetExportTable(ctypes.byref(table), ctypes.byref(uuid))
            words = []
            if rc == 0 and table.value:
                slots = ctypes.cast(table, ctypes.POINTER(ctypes.c_uint64))
                for i in range(40):
                    words.append(slots[i])
            f.write(
                f"{text}\trc={rc}\t"
                + " ".join("0" if w == 0 else (hex(w) if w < 0x100000 else "fn") for w in words)
                + "\n"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
