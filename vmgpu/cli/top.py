"""`vmgpu top`: a live table of every guest's memory and compute, as nvtop or cgpu-smi show a
card's: memory in use (each forwarder's statistics page, read by vmgpud) against the quota, and
the share of each GPU's time the guest held over the last interval (the schedulers' pages)."""

from __future__ import annotations

import time

import click

from vmgpu import reports
from vmgpu.cli import render
from vmgpu.cli.common import SOCKET, WIDE, as_json, client


@click.command("top")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=1.0,
    show_default=True,
    help="Seconds between frames (and over which compute is measured).",
)
@click.option("--once", is_flag=True, help="Print one frame (measured over one interval) and exit.")
@SOCKET
@as_json("Print the frame as JSON (with --once).")
@WIDE
def top(interval, once, socket_path, as_json, wide):
    """A live table of each guest's memory (in use / quota) and compute (its share of the GPU's
    time over the last interval; "-" under the native and shared policies; under shared, what
    the share controller holds it to), refreshed every --interval seconds until Ctrl-C."""
    if as_json and not once:
        raise click.UsageError("--json prints one frame: add --once")
    c = client(socket_path)
    sampler = reports.ComputeSampler({g.uuid for g in c.status().gpus})
    sampler.take()

    def frame() -> dict:
        time.sleep(interval)
        reply = c.status()
        sampler.uuids = {g.uuid for g in reply.gpus}
        return reports.top(reply, sampler.take(), interval, sampler.held)

    if once:
        render.emit(frame(), as_json, render.top, wide)
        return
    from rich.live import Live

    con = render.console(wide)
    try:
        with Live(render.top_frame(frame()), console=con, auto_refresh=False) as live:
            while True:
                live.update(render.top_frame(frame()), refresh=True)
    except KeyboardInterrupt:
        pass


COMMANDS = (top,)
