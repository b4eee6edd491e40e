"""`vmgpu daemon`: run vmgpud in the foreground."""

from __future__ import annotations

import tomllib
from pathlib import Path

import click

from vmgpu import config, errors
from vmgpu.cli.common import SOCKET, inventory

# the options a configuration file may set (its keys: these names, with - or _)
FILE_KEYS = (
    "socket",
    "db",
    "inventory",
    "metrics-port",
    "oom-scripts-dir",
    "oom-script",
    "ctx-reserve",
    "peer-timeout",
    "max-priority",
    "mps",
)
_PARAMS = {"socket": "socket_path", "db": "db_path", "mps": "mps_dir"}  # key -> click parameter, where they differ


def _config_file(ctx, param, value):
    """Read vmgpud's configuration file (TOML, keys FILE_KEYS) into the options' defaults: the
    command line and the environment win over it.  The default file may be absent."""
    if value is None:
        return None
    path = Path(value)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        if param.get_default(ctx) == value and ctx.get_parameter_source(param.name).name == "DEFAULT":
            return None
        raise click.BadParameter(f"{path} does not exist", ctx, param) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise click.BadParameter(f"{path} cannot be read as TOML: {e}", ctx, param) from None
    defaults = {}
    for key, v in data.items():
        k = key.replace("_", "-")
        if k not in FILE_KEYS:
            raise click.BadParameter(f"{path}: unknown key '{key[:40]}' (keys: {', '.join(FILE_KEYS)})", ctx, param)
        defaults[_PARAMS.get(k, k.replace("-", "_"))] = str(v) if not isinstance(v, int | str) else v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _ctx_reserve(ctx, param, value):
    if value is None:
        return None
    from vmgpu.supervisor import ctx_reserve

    try:
        return ctx_reserve(str(value))
    except errors.InvalidArgument as e:
        raise click.BadParameter(e.message, ctx, param) from None


def _peer_timeout(ctx, param, value):
    if value is None:
        return 0
    from vmgpu.spec import peer_timeout

    try:
        return peer_timeout(str(value), "peer timeout")
    except errors.SpecError as e:
        raise click.BadParameter(e.message, ctx, param) from None


@click.command("daemon")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="VMGPU_CONFIG",
    default=config.VMGPUD_CONF,
    show_default=True,
    is_eager=True,
    expose_value=False,
    callback=_config_file,
    help='vmgpud\'s configuration (TOML; keys: the long options below, e.g. oom-script = "notify"); '
    "the command line and the environment win over it; the default file may be absent.  [env: VMGPU_CONFIG]",
)
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
@click.option(
    "--oom-scripts-dir",
    metavar="DIR",
    envvar="VMGPU_OOM_SCRIPTS_DIR",
    default=config.OOM_SCRIPTS_DIR,
    show_default=True,
    help="Where the OOM scripts are (root's, writable by no one else, no links: they run as root); "
    "guests and --oom-script name a script in it.  [env: VMGPU_OOM_SCRIPTS_DIR]",
)
@click.option(
    "--oom-script",
    metavar="NAME",
    envvar="VMGPU_OOM_SCRIPT",
    default="",
    help="The OOM script every forwarder runs when its guest is refused memory (a name in "
    "--oom-scripts-dir; a guest's own oom-script= wins).  [env: VMGPU_OOM_SCRIPT]",
)
@click.option(
    "--ctx-reserve",
    metavar="SIZE",
    envvar="VMGPU_CTX_RESERVE",
    callback=_ctx_reserve,
    help="What each guest process's context is charged where NVML cannot measure it "
    f"(0..{config.CTX_RESERVE_MAX >> 30}G; default the forwarder's: 544M on a GPU).  [env: VMGPU_CTX_RESERVE]",
)
@click.option(
    "--peer-timeout",
    metavar="SECONDS",
    envvar="VMGPU_PEER_TIMEOUT",
    callback=_peer_timeout,
    help=f"Seconds after which a silent guest process is gone ({config.PEER_TIMEOUT_S[0]}..{config.PEER_TIMEOUT_S[1]}; "
    "default the forwarder's: 5; a guest's own peer-timeout= wins).  [env: VMGPU_PEER_TIMEOUT]",
)
@click.option(
    "--max-priority",
    type=click.Choice(["high", "normal", "low"]),
    envvar="VMGPU_MAX_PRIORITY",
    default="high",
    show_default=True,
    help="The highest compute priority a guest may hold here: a share asking for more (priority=, "
    "ALIYUN_COM_GPU_HIGH_PRIO, ONLINE) is refused at admission, and so is `vmgpu priority` above it "
    "(a tenant writes its own share spec).  [env: VMGPU_MAX_PRIORITY]",
)
@click.option(
    "--mps",
    "mps_dir",
    metavar="DIR",
    envvar="VMGPU_MPS",
    default="",
    help="Run an MPS control daemon with its pipes in DIR/pipe and its logs in DIR/log (all made root's, "
    f"0700; e.g. {config.MPS_DIR}) and make a guest's processes its clients when they start while one of "
    "their GPUs' policy is shared, so that those guests run side by side on spans of the SMs (a process "
    "that is a client is one on all its GPUs); the others keep contexts of their own.  MPS clients of a "
    "GPU share one fault domain: a fatal fault in one guest's kernel can end the others' work there, so "
    "share a GPU this way only among guests that accept that.  The daemon outlives vmgpud, as the "
    "forwarders do, and is started again if it dies.  Default: none (guests of a shared GPU are then "
    "held by time).  [env: VMGPU_MPS]",
)
def daemon(
    socket_path,
    db_path,
    inventory,
    metrics_port,
    oom_scripts_dir,
    oom_script,
    ctx_reserve,
    peer_timeout,
    max_priority,
    mps_dir,
):
    """Run vmgpud in the foreground: the ledger, on a unix socket (JSON logs on stderr)."""
    from vmgpu import daemon as vmgpud
    from vmgpu.logging import configure
    from vmgpu.supervisor import HostSettings

    configure(json=True)
    settings = HostSettings(oom_scripts_dir, oom_script, ctx_reserve, peer_timeout, max_priority, mps_dir)
    vmgpud.run(socket_path, db_path, inventory, None if metrics_port < 0 else metrics_port, settings)


COMMANDS = (daemon,)
