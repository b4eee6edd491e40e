"""`vmgpu hooks` and `vmgpu runtime`: install the libvirt qemu hook and the OCI runtime for docker."""

from __future__ import annotations

import click

from vmgpu import config
from vmgpu.cli.common import SOCKET, STARTS_BACKEND, Group

_HOOKS_DIR = click.option(
    "--dir", "hooks_dir", default=config.LIBVIRT_HOOKS_DIR, show_default=True, help="libvirt's hooks directory."
)


@click.group(cls=Group)
def hooks() -> None:
    """The libvirt qemu hook that admits, starts, stops and releases vmgpu guests."""


@hooks.command("install")
@_HOOKS_DIR
@SOCKET
@STARTS_BACKEND
@click.option("--log", "log_path", default=config.HOOK_LOG, show_default=True, help="The hook's JSON log.")
@click.option("--no-reload", is_flag=True, help="Do not send libvirtd SIGHUP (then restart it yourself).")
def hooks_install(hooks_dir, socket_path, backend, log_path, no_reload):
    """Install the hook as HOOKS_DIR/qemu.d/50-vmgpu, run by this Python.

    libvirtd looks for hooks only at start-up and on SIGHUP, so this sends a running libvirtd
    SIGHUP (unless --no-reload)."""
    from vmgpu.virt import hook

    out = hook.install(hooks_dir, {"socket": socket_path, "backend": backend, "log": log_path}, not no_reload)
    click.echo(f"installed {out['path']}")
    if out["libvirtd_reloaded"]:
        click.echo(f"sent SIGHUP to libvirtd (pid {', '.join(map(str, out['libvirtd_reloaded']))})")
    elif no_reload:
        click.echo("libvirtd not signalled: restart it (or send it SIGHUP) before starting vmgpu domains")
    else:
        click.echo("libvirtd is not running; it will find the hook when it starts")


@hooks.command("uninstall")
@_HOOKS_DIR
def hooks_uninstall(hooks_dir):
    """Remove the hook (guests already running keep their forwarders)."""
    from vmgpu.virt import hook

    click.echo("removed the vmgpu hook" if hook.uninstall(hooks_dir) else "no vmgpu hook was installed")


@click.group(cls=Group)
def runtime() -> None:
    """The OCI runtime for docker: `docker run --runtime=vmgpu -e VMGPU="gpu=0,mem=4G" ...`."""


@runtime.command("install")
@click.option(
    "--path", "script_path", default=config.RUNTIME_PATH, show_default=True, help="Where to write the runtime."
)
@click.option(
    "--daemon-json",
    default=config.DOCKER_DAEMON_JSON,
    show_default=True,
    help="docker's daemon.json, where the runtime is registered as 'vmgpu' ('' leaves it alone).",
)
@SOCKET
@STARTS_BACKEND
@click.option("--runc", default="runc", show_default=True, help="The runc it runs containers with.")
def runtime_install(script_path, daemon_json, socket_path, backend, runc):
    """Install the runtime and register it with docker (then restart dockerd or send it SIGHUP)."""
    from vmgpu import oci

    out = oci.install(script_path, {"socket": socket_path, "backend": backend, "runc": runc}, daemon_json or None)
    click.echo(f"installed {out['path']}")
    if out["daemon_json"]:
        click.echo(f"registered as runtime 'vmgpu' in {out['daemon_json']}: restart dockerd or send it SIGHUP")


COMMANDS = (hooks, runtime)
