"""`vmgpu weight` and `vmgpu policy`: how guests share a GPU's time, set live."""

from __future__ import annotations

import click

from vmgpu import config
from vmgpu.cli.common import SOCKET, client, guest_name


@click.command("weight")
@click.argument("guest", callback=guest_name)
@click.argument("gpu")
@click.argument("weight", type=click.IntRange(1, 100))
@SOCKET
def weight(guest, gpu, weight, socket_path):
    """Set GUEST's compute WEIGHT (1..100) on GPU (index or UUID), live.

    Under the weighted policy guests share a busy GPU in proportion to their weights; under
    fixed, the weight is the guest's cap in percent.  The default weight is the compute % of
    the guest's share spec."""
    r = client(socket_path).set_weight(guest, gpu, weight)
    click.echo(f"{guest} on {r.gpu_uuid}: weight {weight}" + ("" if r.live else " (from its forwarder's next start)"))


@click.command("policy")
@click.argument("gpu")
@click.argument("name", type=click.Choice(list(config.POLICIES)))
@SOCKET
def policy(gpu, name, socket_path):
    """Set GPU's (index or UUID) compute policy, live.

    \b
    native      no compute control
    equal       1/N of the time per guest, even when the others are idle
    preemptive  equal shares; an idle guest's time goes to busy ones
    weighted    shares by weight; an idle guest's time goes to busy ones (default)
    fixed       a hard cap of weight% per guest, even on an otherwise idle card"""
    r = client(socket_path).set_policy(gpu, name)
    click.echo(f"{r.gpu_uuid}: policy {name}" + ("" if r.live else " (from the next forwarder's start)"))


COMMANDS = (weight, policy)
