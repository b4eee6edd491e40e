"""`vmgpu region`: create, show and self-test shared-memory regions."""

from __future__ import annotations

import sys

import click

from vmgpu import regions, shm
from vmgpu.cli import render
from vmgpu.cli.common import Group, as_json


@click.group(cls=Group)
def region() -> None:
    """Shared-memory regions: the transport between a guest and its forwarder."""


@region.command("create")
@click.argument("name")
@click.option("--size", default="256M", show_default=True, help="Region size (bytes, or with K/M/G).")
@click.option("--channels", default=16, show_default=True, help="Guest processes that can use the GPU at once.")
@click.option(
    "--wait",
    "wait",
    type=click.Choice(sorted(shm.WAIT_MODES)),
    default="futex",
    show_default=True,
    help="futex: guest on the same kernel (container); poll: guest is a VM.",
)
@click.option("--bulk", default="4M", show_default=True, help="Bulk area per channel (power of two).")
@click.option("--guest-name", default="", help="Name recorded in the header (informational).")
@as_json("Print the layout as JSON.")
def region_create(name, size, channels, wait, bulk, guest_name, as_json):
    """Create and format region NAME (a bare name means /dev/shm/NAME)."""
    render.emit(regions.create(name, size, channels, wait, bulk, guest_name), as_json, render.region_created)


@region.command("show")
@click.argument("name")
@as_json()
def region_show(name, as_json):
    """Show region NAME's header and channels (read-only)."""
    render.emit(regions.show(name), as_json, render.region)


@region.command("selftest")
@click.option("--exchanges", default=20000, show_default=True, help="Round trips to make.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="Seconds the guest process may take; after them it is killed and the self-test fails.",
)
@as_json()
def region_selftest(exchanges, timeout, as_json):
    """Check the transport on this host: a region in /dev/shm, a guest process,
    checksummed round trips, a heap buffer seen at the same offset by both sides,
    and the channel reclaimed when the guest exits.  A guest process that dies, or
    outlasts --timeout, fails it at once with one line saying so."""
    from vmgpu.selftest import run_selftest

    res = run_selftest(exchanges, timeout)
    render.emit(res, as_json, render.selftest)
    if not all(res["checks"].values()):
        sys.exit(1)


COMMANDS = (region,)
