"""`vmgpu doctor` and `vmgpu demo`: check this host, and show vmgpu working on it."""

from __future__ import annotations

import sys

import click

from vmgpu.cli import render
from vmgpu.cli.common import SOCKET, as_json


@click.command("doctor")
@SOCKET
@click.option(
    "--pool",
    "pool_url",
    envvar="VMGPU_POOL",
    help="Also check this GPU pool: its etcd members, the route and MTU to each host.  [env: VMGPU_POOL]",
)
@as_json()
def doctor(socket_path, pool_url, as_json):
    """Check this host for vmgpu: driver, NVML, native parts, /dev/shm, vmgpud, libvirt.

    Each line says what is wrong and how to fix it.  Exits 1 if a check failed."""
    from vmgpu.doctor import run_doctor

    checks = run_doctor(socket_path, pool_url)
    render.emit(checks, as_json, render.doctor)
    if any(c["status"] == "fail" for c in checks):
        sys.exit(1)


@click.command("demo")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cuda", "sim"]),
    default="auto",
    show_default=True,
    help="cuda: this host's GPU; sim: the simulated backend (tests only); auto: cuda if a GPU is here.",
)
@as_json("Print the results as JSON.")
def demo(backend, as_json):
    """Run unchanged CUDA programs through vmgpu on this host.

    Starts a forwarder on a fresh region in /dev/shm, runs a driver-API program and an
    nvcc-built vector add with vmgpu's libcuda.so.1, and shows what the forwarder did.
    An installed wheel carries them (the vector add where the wheel was built with nvcc; it
    says so where not); a checkout needs `make native cuda-programs`.  Exits 1 if a program
    failed."""
    from vmgpu.demo import run_demo

    result = run_demo(backend)
    render.emit(result, as_json, render.demo)
    if not all(r["ok"] for r in result["programs"]):
        sys.exit(1)


COMMANDS = (doctor, demo)
