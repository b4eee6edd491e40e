"""What the `vmgpu` command groups share: the group class that turns a VmgpuError into one line
and its exit code (from the code table, vmgpu/errors.py), the guest-name check, and the options
several commands take."""

from __future__ import annotations

import click

from vmgpu import config, errors, names


class Group(click.Group):
    """Turns every VmgpuError into one readable line and its stable exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.VmgpuError as e:
            click.echo(f"vmgpu: error: {e.message} [{e.code}]", err=True)
            ctx.exit(errors.CODES[e.code].exit_code)


def guest_name(ctx, param, value):
    """A guest name argument: the one rule (vmgpu/names.py)."""
    return names.check_guest(value)


def as_json(help_text: str = "Print as JSON."):
    return click.option("--json", "as_json", is_flag=True, help=help_text)


WIDE = click.option(
    "--wide", is_flag=True, help="Full values (GPU UUIDs) even on a narrow terminal; off a terminal they always are."
)

SOCKET = click.option(
    "--socket",
    "socket_path",
    envvar="VMGPU_SOCKET",
    default=config.SOCKET,
    show_default=True,
    help="vmgpud's unix socket.  [env: VMGPU_SOCKET]",
)

CONNECT = click.option(
    "--connect",
    "-c",
    "uri",
    envvar="LIBVIRT_DEFAULT_URI",
    default=config.LIBVIRT_URI,
    show_default=True,
    help="libvirt connection URI.  [env: LIBVIRT_DEFAULT_URI]",
)

STARTS_BACKEND = click.option(
    "--backend",
    type=click.Choice(list(config.BACKENDS)),
    default="cuda",
    show_default=True,
    help="Backend of the forwarders it starts (sim: tests only).",
)


def inventory(help_text: str):
    return click.option("--inventory", type=click.Path(dir_okay=False), envvar="VMGPU_INVENTORY", help=help_text)


def client(socket_path: str):
    """vmgpud's client for a command."""
    from vmgpu.client import Client

    return Client(socket_path)
