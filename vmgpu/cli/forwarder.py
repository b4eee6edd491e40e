"""`vmgpu forwarder start|stop` (through vmgpud) and `vmgpu breakdown` (a forwarder's statistics)."""

from __future__ import annotations

import click

from vmgpu import config, reports
from vmgpu.cli import render
from vmgpu.cli.common import SOCKET, Group, as_json, client, guest_name


@click.group(cls=Group)
def forwarder() -> None:
    """Forwarders: the host processes that serve a guest's region on its GPUs (via vmgpud)."""


@forwarder.command("start")
@click.argument("guest", callback=guest_name)
@click.argument("region")
@click.option(
    "--backend",
    type=click.Choice(list(config.BACKENDS)),
    default="cuda",
    show_default=True,
    help="sim: the simulated backend (tests only).",
)
@click.option("--size", default="", help="Create the region with this size (e.g. 1G); default: it exists.")
@SOCKET
def forwarder_start(guest, region, backend, size, socket_path):
    """Serve the admitted GUEST's REGION with its quota.

    REGION is the region file, such as /dev/shm/vmgpu-GUEST (created with --size)."""
    pid = client(socket_path).start_forwarder(guest, region, backend, size)
    click.echo(f"forwarder for {guest} running (pid {pid})")


@forwarder.command("stop")
@click.argument("guest", callback=guest_name)
@SOCKET
def forwarder_stop(guest, socket_path):
    """Stop GUEST's forwarder (GUEST stays admitted)."""
    stopped = client(socket_path).stop_forwarder(guest)
    click.echo(f"forwarder for {guest} stopped" if stopped else f"{guest} had no forwarder")


@click.command("breakdown")
@click.argument("stats_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--interval", type=float, default=0.0, help="Report only what happens in the next N seconds.")
@click.option("--top", type=int, default=10, show_default=True, help="How many functions to list.")
@as_json()
def breakdown(stats_file, interval, top, as_json):
    """Where a guest's time goes: calls crossed (sync/async), bytes copied, forwarder busy
    time, and the top functions by count and by time.  STATS_FILE is a forwarder's --stats."""
    render.emit(reports.breakdown(stats_file, interval), as_json, render.breakdown, top)


COMMANDS = (forwarder, breakdown)
