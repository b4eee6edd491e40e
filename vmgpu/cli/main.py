"""The `vmgpu` command: the root group and its command groups, one module each (click
commands only: parse, call the library, print through vmgpu/cli/render.py).

    region.py    region create | show | selftest
    shares.py    gpus, admit, release, status
    top.py       top
    compute.py   weight, cap, priority, policy
    forwarder.py forwarder start | stop, breakdown
    daemon.py    daemon
    vm.py        vm attach | detach | show
    install.py   setup, hooks install | uninstall, runtime install
    host.py      doctor, demo
    pool.py      pool join | leave | admit | release | status | verify
A VmgpuError ends any of them with one line and its exit code (common.Group, from the code
table of vmgpu/errors.py)."""

from __future__ import annotations

import click

from vmgpu import __version__
from vmgpu.cli import compute, daemon, forwarder, host, install, pool, region, shares, top, vm
from vmgpu.cli.common import Group


@click.group(cls=Group)
@click.version_option(__version__, prog_name="vmgpu")
def cli() -> None:
    """vmgpu: share NVIDIA GPUs among VMs and containers by CUDA API remoting."""


for module in (region, shares, top, compute, forwarder, daemon, vm, install, host, pool):
    for command in module.COMMANDS:
        cli.add_command(command)


def main() -> None:
    cli(prog_name="vmgpu")


if __name__ == "__main__":
    main()
