"""`vmgpu pool join | leave | admit | release | status | verify`: the GPU pool across hosts, on
etcd (vmgpu/pool/)."""

from __future__ import annotations

import os
import signal
import socket
import sys

import click

from vmgpu.cli import render
from vmgpu.cli.common import WIDE, as_json, guest_name, inventory

POOL = click.option(
    "--pool",
    "pool_url",
    envvar="VMGPU_POOL",
    required=True,
    help="The pool's etcd members: etcd://HOST:PORT[,HOST:PORT...].  [env: VMGPU_POOL]",
)


def _host_name(ctx, param, value):
    from vmgpu import names

    return names.check_guest(value, "host name")


def _store(pool_url: str, json_logs: bool = False):
    """The pool's etcd, for a command; what it logs (records left out) readable on stderr,
    JSON lines for the agent."""
    from vmgpu.logging import configure
    from vmgpu.pool.store import Store

    configure(json=json_logs)
    return Store(pool_url)


@click.group("pool")
def pool() -> None:
    """The GPU pool across hosts: hosts join it with their GPUs, guests anywhere get slices of them.

    The pool lives in etcd (opt-in; a single host keeps its own ledger).  The guest's data path
    over the network is not built yet: a grant names the host's address and a token for it."""


@pool.command("join")
@POOL
@click.option(
    "--host",
    "host_name",
    help="This host's name in the pool.  [default: the hostname]",
)
@click.option(
    "--bind-net",
    "ifname",
    help="The interface whose address guests reach this host's forwarders on (as boyue's bind_net).",
)
@click.option("--address", help="The data-plane address itself (instead of --bind-net).")
@click.option("--port", default=7471, show_default=True, type=click.IntRange(1, 65535), help="The data-plane port.")
@click.option(
    "--ttl",
    "ttl_s",
    default=10,
    show_default=True,
    type=click.IntRange(1, 3600),
    help="Seconds without renewal after which the host leaves the pool with its GPUs and their slices.",
)
@inventory("A declared inventory (TOML) instead of NVML.  [env: VMGPU_INVENTORY]")
def join(pool_url, host_name, ifname, address, port, ttl_s, inventory):
    """Register this host's GPUs in the pool and keep them there while it runs (in the foreground).

    Stopping it (or the host dying) takes the host out after --ttl seconds, with the slices guests
    held on its GPUs; restarted within them, it keeps everything.  Logs are JSON lines on stderr."""
    from vmgpu import gpu
    from vmgpu.errors import InvalidArgument
    from vmgpu.pool import net
    from vmgpu.pool.agent import Agent, Membership

    host_name = host_name or socket.gethostname().split(".")[0]
    if bool(ifname) == bool(address):
        raise InvalidArgument("give one of --bind-net IFNAME and --address ADDR (where guests reach this host)")
    if ifname:
        address = net.interface_address(ifname)
    agent = Agent(
        _store(pool_url, json_logs=True), Membership(host_name, address, port, ttl_s), gpu.inventory(inventory)
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop.set())
    agent.run()


@pool.command("leave")
@POOL
@click.argument("host", callback=_host_name)
def leave(pool_url, host):
    """Take HOST out of the pool now: its GPUs, and the slices guests hold on them, are dropped."""
    from vmgpu.pool.agent import leave as leave_pool

    click.echo(f"{host} left the pool" if leave_pool(_store(pool_url), host) else f"{host} was not in the pool")


@pool.command("admit")
@click.argument("guest", callback=guest_name)
@POOL
@click.option("--slices", "count", type=int, help="How many GPUs (boyue_VGPU).")
@click.option("--mem", help="Memory per slice: 4096M, 4G, or 50% of a GPU (boyue_GMEM, MiB).")
@click.option("--compute", "compute_pct", type=int, help="Compute reserved per slice, percent of a GPU (boyue_RATIO).")
@as_json()
@WIDE
def admit(guest, pool_url, count, mem, compute_pct, as_json, wide):
    """Reserve slices for GUEST on the pool's least-loaded GPUs, all or none, and print its token.

    Without --slices, --mem and --compute, boyue's variables are read from the environment
    (boyue_VGPU=2 boyue_GMEM=4096 boyue_RATIO=50).  The token is shown once: the pool keeps only
    its hash, and the hosts' forwarders will ask it of the guest."""
    from vmgpu.pool import admission

    if count is None and mem is None and compute_pct is None:
        req = admission.request_from_env(dict(os.environ))
    else:
        req = admission.request(count or 1, mem or "100%", compute_pct or 100)
    grant = admission.admit(_store(pool_url), guest, req)
    render.emit(grant.to_dict(), as_json, render.pool_grant, wide)


@pool.command("release")
@click.argument("guest", callback=guest_name)
@POOL
def release(guest, pool_url):
    """Give back everything GUEST holds in the pool (nothing to give back is not an error)."""
    from vmgpu.pool import admission

    held = admission.release(_store(pool_url), guest)
    click.echo(f"released {guest}" if held else f"{guest} held nothing in the pool")


@pool.command("status")
@POOL
@as_json()
@WIDE
def status(pool_url, as_json, wide):
    """Every host (address, lease left), GPU (memory and compute reserved) and guest of the pool."""
    from vmgpu.pool.status import pool_status

    render.emit(pool_status(_store(pool_url)), as_json, render.pool_status, wide)


@pool.command("verify")
@click.argument("guest", callback=guest_name)
@POOL
@click.option("--host", "host_name", required=True, help="The host the guest is served on.")
def verify(guest, pool_url, host_name):
    """Check a guest's token (read from stdin, never an argument) as a host's forwarder will:
    exits 0 if GUEST holds slices on --host under it, 1 with the reason otherwise."""
    from vmgpu.pool.admission import verify_token

    token = sys.stdin.readline(200).strip()
    answer = verify_token(_store(pool_url), guest, token, host_name)
    if not answer.granted:
        click.echo(f"vmgpu: refused: {answer.reason}", err=True)
        sys.exit(1)
    click.echo(f"{guest} may use {', '.join(f'{s.uuid} ({s.mem_mib} MiB)' for s in answer.slices)} on {host_name}")


COMMANDS = (pool,)
