"""`vmgpu daemon`: run vmgpud in the foreground."""

from __future__ import annotations

import click

from vmgpu import config
from vmgpu.cli.common import SOCKET, inventory


@click.command("daemon")
@SOCKET
@click.option(
    "--db",
    "db_path",
    envvar="VMGPU_DB",
    default=config.LEDGER_DB,
    show_default=True,
    help="The admission ledger (SQLite).  [env: VMGPU_DB]",
)
@inventory("A declared GPU inventory (TOML) instead of NVML.  [env: VMGPU_INVENTORY]")
@click.option(
    "--metrics-port",
    type=int,
    default=config.METRICS_PORT,
    show_default=True,
    help="Prometheus metrics on 127.0.0.1:PORT (0: any free port; -1: none).",
)
def daemon(socket_path, db_path, inventory, metrics_port):
    """Run vmgpud in the foreground: the ledger, on a unix socket (JSON logs on stderr)."""
    from vmgpu import daemon as vmgpud
    from vmgpu.logging import configure

    configure(json=True)
    vmgpud.run(socket_path, db_path, inventory, None if metrics_port < 0 else metrics_port)


COMMANDS = (daemon,)
