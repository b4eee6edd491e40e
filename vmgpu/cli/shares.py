"""`vmgpu gpus`, `admit`, `release`, `status`: the host's GPUs and the guests' shares of them."""

from __future__ import annotations

import click

from vmgpu import config, reports
from vmgpu.cli import render
from vmgpu.cli.common import SOCKET, WIDE, as_json, client, guest_name, inventory


@click.command("gpus")
@inventory("A declared inventory (TOML) instead of NVML, for hosts without a driver.  [env: VMGPU_INVENTORY]")
@as_json()
@WIDE
def gpus(inventory, as_json, wide):
    """The host's GPUs: index, UUID, name, memory, PCI bus id."""
    from vmgpu import gpu

    render.emit([g.__dict__ for g in gpu.inventory(inventory)], as_json, render.gpus, inventory, wide)


@click.command("admit")
@click.argument("guest", callback=guest_name)
@click.argument("spec")
@click.option(
    "--kind",
    type=click.Choice(list(config.KINDS)),
    default="process",
    show_default=True,
    help="What the guest is.",
)
@SOCKET
@as_json()
@WIDE
def admit(guest, spec, kind, socket_path, as_json, wide):
    """Reserve a share for GUEST, all slices or none.  SPEC: "gpu=0,mem=8G,weight=50;gpu=1,...", each
    slice with optional weight=1..100 (relative, default 100, reserves nothing; compute= is its old
    name), guarantee=N% (reserved: a GPU's guarantees never sum past 100%), cap=N% and
    priority=high|normal|low, and the guest's own forwarder settings in a group of their own if
    any (";oom-script=NAME,peer-timeout=S")."""
    reply = client(socket_path).admit(guest, kind, spec)
    render.emit(reports.admitted(reply), as_json, render.admitted, guest, wide)


@click.command("release")
@click.argument("guest", callback=guest_name)
@SOCKET
def release(guest, socket_path):
    """Free everything GUEST holds (nothing to free is not an error)."""
    held = client(socket_path).release(guest)
    click.echo(f"released {guest}" if held else f"{guest} held nothing")


@click.command("status")
@SOCKET
@as_json()
@WIDE
def status(socket_path, as_json, wide):
    """Per GPU: memory reserved and free, compute guaranteed, and its policy; per guest: its slices,
    with its memory in use, its weight, guarantee, cap and priority and the share of GPU time it
    gets now (over 0.3 s; "-" under the native and shared policies, which meter none); under
    shared, what the share controller holds it to now (the % of each period its work waits, and
    its depth where one is set).  --wide adds the GPUs' UUIDs."""
    reply = client(socket_path).status()
    sampled = reports.achieved_compute({g.uuid for g in reply.gpus})
    render.emit(reports.status(reply, sampled.shares, sampled.held, sampled.cap_parts), as_json, render.status, wide)


COMMANDS = (gpus, admit, release, status)
