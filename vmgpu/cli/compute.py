"""`vmgpu weight`, `cap`, `priority` and `policy`: how guests share a GPU's time, set live."""

from __future__ import annotations

import click

from vmgpu import config, errors, spec
from vmgpu.cli.common import SOCKET, client, guest_name


@click.command("weight")
@click.argument("guest", callback=guest_name)
@click.argument("gpu")
@click.argument("weight", type=click.IntRange(1, 100))
@SOCKET
def weight(guest, gpu, weight, socket_path):
    """Set GUEST's compute WEIGHT (1..100) on GPU (index or UUID), live.

    Under the weighted policy guests share a busy GPU in proportion to their weights (after
    the guarantees of the busy ones); under fixed, the weight is the guest's cap in percent.
    A weight reserves nothing.  The default is the weight of the guest's share spec (100)."""
    r = client(socket_path).set_weight(guest, gpu, weight)
    click.echo(f"{guest} on {r.gpu_uuid}: weight {weight}" + _when(r))


def _when(reply) -> str:
    return "" if reply.live else " (from its forwarder's next start)"


def _cap(ctx, param, value):
    try:
        return spec.cap(value)
    except errors.SpecError as e:
        raise click.BadParameter(e.message) from None


@click.command("cap")
@click.argument("guest", callback=guest_name)
@click.argument("gpu")
@click.argument("cap", metavar="CAP", callback=_cap)
@SOCKET
def cap(guest, gpu, cap, socket_path):
    """Set GUEST's CAP on GPU (index or UUID), live: at most CAP% (1..100) of its throughput
    alone, even on an otherwise idle card (vmgpud's cap controller sets the part of each period
    its work may have; a guest whose work fits in CAP% of the time is left so; under the equal
    policy, CAP% of the time); "none" (or 0) lifts it.  The guests beside it keep their weighted
    shares."""
    r = client(socket_path).set_cap(guest, gpu, cap)
    click.echo(f"{guest} on {r.gpu_uuid}: " + (f"cap {cap}%" if cap else "no cap") + _when(r))


@click.command("priority")
@click.argument("guest", callback=guest_name)
@click.argument("gpu")
@click.argument("priority", type=click.Choice(list(spec.PRIORITIES), case_sensitive=False))
@SOCKET
def priority(guest, gpu, priority, socket_path):
    """Set GUEST's PRIORITY on GPU (index or UUID), live.

    A waiting guest of a higher priority has the GPU before any lower one, and a lower
    guest's turn ends as soon as a higher one has work (under the shared policy, a lower
    guest's work waits while a higher one's goes); guests of one priority share by weight,
    and lower ones get what the higher leave."""
    priority = priority.lower()
    r = client(socket_path).set_priority(guest, gpu, priority)
    click.echo(f"{guest} on {r.gpu_uuid}: priority {priority}" + _when(r))


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
    fixed       a hard cap of weight% per guest, even on an otherwise idle card
    shared      side by side (forwarders on MPS), each guest held back only as far
                as its weight needs, and a lower priority while a higher one works;
                progress, not time, is shared (vmgpud); with `vmgpu daemon --mps`
                the guest processes that start from now on run on spans of the SMs,
                without it guests are held by time"""
    c = client(socket_path)
    r = c.set_policy(gpu, name)
    click.echo(f"{r.gpu_uuid}: policy {name}" + ("" if r.live else " (from the next forwarder's start)"))
    if name == "shared":
        try:
            settings = c.status().settings
        except errors.VmgpuError:  # (the policy is set: only the note is lost)
            return
        if not settings.mps_dir:
            click.echo(
                "note: vmgpud runs no MPS daemon (vmgpu daemon --mps DIR), so the guests take turns by time, "
                "held to their shares; side by side needs it"
            )
        elif not settings.mps_pid:
            click.echo(f"note: vmgpud's MPS daemon ({settings.mps_dir}) is not running: see vmgpu doctor")
        else:
            click.echo(
                "note: guest processes started from now on run side by side on spans of the SMs; until the ones "
                "running now end, the GPU's guests are held by time"
            )


COMMANDS = (weight, cap, priority, policy)
