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
    help="The pool's etcd members: etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS: VMGPU_POOL_CA, "
    "VMGPU_POOL_CERT, VMGPU_POOL_KEY).  [env: VMGPU_POOL]",
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

    The pool lives in etcd (opt-in; a single host keeps its own ledger).  A host that joins with
    --serve runs a forwarder for each guest holding slices on it and takes their processes'
    calls over TLS (vmgpu-netbridge); on the guest's machine `vmgpu pool attach` makes the region
    the guest maps and carries it there."""


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
@click.option(
    "--serve",
    "serve_dir",
    type=click.Path(file_okay=False),
    help="Serve guests on other machines from here: the data plane's state directory (its TLS "
    "key and certificate, made once; the guests served).  Without it the host only lends GPUs "
    "to the ledger.",
)
@click.option(
    "--backend",
    type=click.Choice(["cuda", "sim"]),
    default="cuda",
    show_default=True,
    help="The guests' forwarders' backend (sim: the simulated one, for tests).",
)
def join(pool_url, host_name, ifname, address, port, ttl_s, inventory, serve_dir, backend):
    """Register this host's GPUs in the pool and keep them there while it runs (in the foreground).

    Stopping it (or the host dying) takes the host out after --ttl seconds, with the slices guests
    held on its GPUs; restarted within them, it keeps the slices (guests served with --serve get
    fresh forwarders: their processes start again).  Logs are JSON lines on stderr."""
    from vmgpu import gpu
    from vmgpu.errors import InvalidArgument
    from vmgpu.pool import net
    from vmgpu.pool.agent import Agent, Membership

    host_name = host_name or socket.gethostname().split(".")[0]
    if bool(ifname) == bool(address):
        raise InvalidArgument("give one of --bind-net IFNAME and --address ADDR (where guests reach this host)")
    if ifname:
        address = net.interface_address(ifname)
    plane = None
    if serve_dir:
        from pathlib import Path

        from vmgpu.pool.dataplane import DataPlane

        listen = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        plane = DataPlane(host_name, Path(serve_dir), listen, backend)
    agent = Agent(
        _store(pool_url, json_logs=True),
        Membership(host_name, address, port, ttl_s),
        gpu.inventory(inventory),
        dataplane=plane,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop.set())
    agent.run()


@pool.command("attach")
@click.argument("guest", callback=guest_name)
@POOL
@click.option(
    "--token-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="The guest's token (as `vmgpu pool admit` printed it), in a file only you can read.",
)
@click.option("--region", required=True, help="The region to make for the guest: a /dev/shm name or path.")
@click.option("--size", default="256M", show_default=True, help="The region's size.")
@click.option("--host", "host_name", help="Which of the guest's hosts, where its slices are on several.")
def attach(guest, pool_url, token_file, region, size, host_name):
    """On the guest's machine: make the region GUEST maps (a container's /dev/shm file, a VM's
    ivshmem backing) and carry its processes' calls over TLS to the host serving its slices.

    Runs in the foreground until stopped; the region goes with it.  The host's certificate is
    checked against the fingerprint it published in the pool."""
    from vmgpu.errors import InvalidArgument, NotFound
    from vmgpu.pool.admission import describe
    from vmgpu.pool.dataplane import netbridge
    from vmgpu.shm import Region

    slices = describe(_store(pool_url), guest)["slices"]
    if not slices:
        raise NotFound(f"guest {guest} holds no slices in the pool (admit it first: vmgpu pool admit)")
    hosts = sorted({s.host for s in slices})
    if host_name is None and len(hosts) > 1:
        raise InvalidArgument(
            f"guest {guest} has slices on {', '.join(hosts)}: one region reaches one host; give --host "
            "(and one region per host)"
        )
    chosen = [s for s in slices if s.host == (host_name or hosts[0])]
    if not chosen:
        raise NotFound(f"guest {guest} holds no slice on host {host_name}")
    s = chosen[0]
    if not s.fingerprint or not s.address:
        raise InvalidArgument(f"host {s.host} serves no remote guests (it joined the pool without --serve)")
    where = f"[{s.address}]:{s.port}" if ":" in s.address else f"{s.address}:{s.port}"
    argv = [str(netbridge()), "attach", "--connect", where, "--guest", guest, "--region", str(Region.resolve(region))]
    argv += ["--size", size, "--fingerprint", s.fingerprint, "--token-file", token_file]
    sys.stdout.flush()
    os.execv(argv[0], argv)


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
