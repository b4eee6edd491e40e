"""`vmgpu setup`: vmgpud's service, the qemu hook and the docker runtime at once, run by this
installed package; `vmgpu hooks` and `vmgpu runtime`: the hook and the runtime one at a time."""

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
    _checkout_note()
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
    _checkout_note()
    if out["daemon_json"]:
        click.echo(f"registered as runtime 'vmgpu' in {out['daemon_json']}: restart dockerd or send it SIGHUP")


def _checkout_note() -> None:
    from vmgpu.install import checkout_of, package_dir

    tree = checkout_of(package_dir())
    if tree:
        click.echo(
            f"note: written to run vmgpu from the checkout {tree}: it breaks if the checkout moves (`vmgpu setup` "
            "from an installed wheel does not)",
            err=True,
        )


@click.command("setup")
@click.option("--uninstall", is_flag=True, help="Remove what setup wrote (the rest of daemon.json is kept).")
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default="/",
    show_default=True,
    help="Write under this directory instead of / (an image, a test); nothing running is touched.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be written or removed; change nothing.")
@click.option(
    "--init",
    "init",
    type=click.Choice(["auto", "systemd", "none"]),
    default="auto",
    show_default=True,
    help="vmgpud's service: a systemd unit, or none (the foreground command is shown); auto: " "systemd where it runs.",
)
@click.option("--hook/--no-hook", default=None, help="The libvirt qemu hook  [default: where /etc/libvirt is]")
@click.option(
    "--runtime/--no-runtime", default=None, help="The docker runtime  [default: where /etc/docker or dockerd is]"
)
@click.option("--no-start", is_flag=True, help="Do not enable and start vmgpud or signal libvirtd.")
@click.option("--allow-checkout", is_flag=True, help="Install even when vmgpu runs from a source checkout.")
@SOCKET
@STARTS_BACKEND
def setup(uninstall, root, dry_run, init, hook, runtime, no_start, allow_checkout, socket_path, backend):
    """Install vmgpud's systemd unit, the libvirt qemu hook, the docker runtime and `vmgpu` on
    PATH, all run by this Python and its installed vmgpu package (never a checkout's).  Safe to
    run again: files already right are left alone.  Nothing is written through a symbolic link."""
    from pathlib import Path

    from vmgpu import install

    opts = install.Options(
        root=Path(root).absolute(),
        socket=socket_path,
        backend=backend,
        init=init,
        hook=hook,
        runtime=runtime,
        dry_run=dry_run,
        start=not no_start,
        allow_checkout=allow_checkout,
    )
    rep = install.uninstall(opts) if uninstall else install.setup(opts)
    for line in rep.lines:
        click.echo(line)
    if not rep.changed:
        click.echo("nothing to change")


COMMANDS = (hooks, runtime, setup)
