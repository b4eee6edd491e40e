"""vmgpu/config.py is the one place of the control plane's constants: the socket path and the
other host paths are spelled nowhere else, the region geometry the control plane uses is the
transport's own default (C's), and there is one size parser, which the others share."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from vmgpu import abi, config, shm, spec
from vmgpu.errors import InvalidArgument
from vmgpu.virt import domain, hook

VMGPU = Path(__file__).resolve().parent.parent.parent / "vmgpu"


@pytest.mark.parametrize(
    "constant",
    [config.SOCKET, config.LEDGER_DB, config.HOOK_LOG, config.RUNTIME_LOG, config.RUNTIME_PATH, config.QEMU_CONF],
)
def test_each_host_path_is_spelled_only_in_config(constant):
    spelled = [
        str(p.relative_to(VMGPU))
        for p in VMGPU.rglob("*.py")
        if f'"{constant}"' in p.read_text() and p.name != "config.py"
    ]
    assert spelled == []


def test_the_control_planes_region_geometry_is_the_transports_default():
    c = abi.ShmParams()
    shm.lib().vmgpu_shm_params_default(ctypes.byref(c))
    for wait in config.WAITS:
        p = config.region_params(wait)
        assert (p.nchannels, p.req_ring_size, p.cpl_ring_size, p.bulk_size, p.heap_block_size) == (
            c.nchannels,
            c.req_ring_size,
            c.cpl_ring_size,
            c.bulk_size,
            c.heap_block_size,
        )
        assert p.wait_mode == shm.WAIT_MODES[wait]
        assert config.region_geometry(wait) == {"wait": wait, "channels": c.nchannels, "bulk": c.bulk_size}
    assert hook.region_params() == config.region_params("poll")  # a VM's region polls


@pytest.mark.parametrize(
    "text, size",
    [("4096", 4096), ("64M", 64 << 20), ("1GiB", 1 << 30), ("2k", 2048), (" 1.5G ", 3 << 29), ("8MB", 8 << 20)],
)
def test_one_size_parser_reads_binary_units(text, size):
    assert config.parse_size(text) == size
    assert shm.parse_size is config.parse_size  # the binding's name for it is the same function


@pytest.mark.parametrize("text", ["lots", "", "G", "4BB", "1.5"])
def test_a_size_that_is_no_number_of_bytes_is_one_clear_error(text):
    with pytest.raises(InvalidArgument, match="is not a number of bytes"):
        config.parse_size(text)


def test_share_specs_and_domain_xml_read_units_from_the_same_table():
    for unit, mib in (("K", 1), ("M", 1024), ("G", 1)):
        n = (config.UNIT_BYTES["M"] * mib) // config.UNIT_BYTES[unit] if unit != "G" else 1
        assert spec.parse(f"gpu=0,mem={n}{unit}").slices[0].mem_mib == n * config.UNIT_BYTES[unit] >> 20
    xml = domain.attach("<domain><name>d</name><devices/></domain>", spec.parse("gpu=0,mem=1G"), 16)
    size = domain.read(xml)[1]["size_mib"]
    kib = re.sub(r'<size unit="M">(\d+)</size>', lambda m: f'<size unit="K">{int(m.group(1)) << 10}</size>', xml)
    assert domain.read(kib)[1]["size_mib"] == size
