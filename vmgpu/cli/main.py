"""The `vmgpu` command.  Click commands only: parsing, calling, printing."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vmgpu import __version__, names, shm
from vmgpu.demo import run_demo
from vmgpu.errors import VmgpuError
from vmgpu.selftest import run_selftest


class _Group(click.Group):
    """Turns every VmgpuError into one readable line and its stable exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VmgpuError as e:
            click.echo(f"vmgpu: error: {e.message} [{e.code}]", err=True)
            ctx.exit(e.exit_code)


def _guest(ctx, param, value):
    """A guest name argument: the one rule (vmgpu/names.py)."""
    return names.check_guest(value)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="vmgpu")
def cli() -> None:
    """vmgpu: share NVIDIA GPUs among VMs and containers by CUDA API remoting."""


@cli.group(cls=_Group)
def region() -> None:
    """Shared-memory regions: the transport between a guest and its forwarder."""


def _emit(data, as_json: bool, render) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data)


@region.command("create")
@click.argument("name")
@click.option("--size", default="256M", show_default=True, help="Region size (bytes, or with K/M/G).")
@click.option("--channels", default=16, show_default=True, help="Guest processes that can use the GPU at once.")
@click.option(
    "--wait",
    "wait",
    type=click.Choice(sorted(shm.WAIT_MODES)),
    default="futex",
    show_default=True,
    help="futex: guest on the same kernel (container); poll: guest is a VM.",
)
@click.option("--bulk", default="4M", show_default=True, help="Bulk area per channel (power of two).")
@click.option("--guest-name", default="", help="Name recorded in the header (informational).")
@click.option("--json", "as_json", is_flag=True, help="Print the layout as JSON.")
def region_create(name, size, channels, wait, bulk, guest_name, as_json):
    """Create and format region NAME (a bare name means /dev/shm/NAME)."""
    params = shm.Params(nchannels=channels, wait_mode=shm.WAIT_MODES[wait], bulk_size=shm.parse_size(bulk))
    path = shm.Region.resolve(name)
    r = shm.Region.create(path, shm.parse_size(size), params, guest_name or path.name)
    lay = params.layout(r.size)
    r.close()
    out = {
        "path": str(path),
        "size": lay["region_size"],
        "channels": channels,
        "wait": wait,
        "heap_bytes": lay["heap_size"],
        "bulk_bytes_per_channel": lay["bulk_size"],
    }

    def render(d):
        click.echo(
            f"created {d['path']}: {d['size']} bytes, {d['channels']} channels, "
            f"{d['heap_bytes'] >> 20} MiB pinned heap, wait mode {d['wait']}"
        )

    _emit(out, as_json, render)


@region.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def region_show(name, as_json):
    """Show region NAME's header and channels (read-only)."""
    r = shm.Region.open(shm.Region.resolve(name))
    try:
        params = r.check()
        hdr = r.header()
        chans = r.channels(params)
    finally:
        r.close()
    out = {"path": str(r.path), "header": hdr, "channels": chans}

    def render(d):
        h = d["header"]
        con = Console()
        con.print(
            f"[bold]{d['path']}[/]  ABI {h['version_major']}.{h['version_minor']}  "
            f"{h['region_size']} bytes  name={h['name']!r}  wait={'futex' if h['wait_mode'] == 1 else 'poll'}  "
            f"host pid {h['host_pid'] or '-'}  heartbeat {h['host_heartbeat']}"
        )
        t = Table("ch", "state", "gen", "pid", "process", "host", "req used", "cpl used", "bulk used", "heap")
        for c in d["channels"]:
            if c["state"] == "free" and not c["generation"]:
                continue
            t.add_row(
                str(c["index"]),
                c["state"],
                str(c["generation"]),
                str(c["owner_pid"] or "-"),
                c["owner"] or "-",
                c["host_status"],
                str(c["req_used"]),
                str(c["cpl_used"]),
                str(c["bulk_used"]),
                f"{c['heap_bytes'] >> 10} KiB",
            )
        con.print(t if t.row_count else "no channel has been used yet")

    _emit(out, as_json, render)


@region.command("selftest")
@click.option("--exchanges", default=20000, show_default=True, help="Round trips to make.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def region_selftest(exchanges, as_json):
    """Check the transport on this host: a region in /dev/shm, a guest process,
    checksummed round trips, a heap buffer seen at the same offset by both sides,
    and the channel reclaimed when the guest exits."""
    res = run_selftest(exchanges)

    def render(d):
        t = Table("check", "result")
        for k, v in d["checks"].items():
            t.add_row(k, "[green]ok[/]" if v else "[red]FAILED[/]")
        Console().print(t)
        click.echo(
            f"{d['exchanges']} round trips in {d['seconds']:.3f} s "
            f"({d['exchanges'] / d['seconds']:.0f}/s through the Python binding)"
        )

    _emit(res, as_json, render)
    if not all(res["checks"].values()):
        sys.exit(1)


@cli.command("gpus")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False),
    envvar="VMGPU_INVENTORY",
    help="A declared inventory (TOML) instead of NVML, for hosts without a driver.  [env: VMGPU_INVENTORY]",
)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def gpus(inventory, as_json):
    """The host's GPUs: index, UUID, name, memory, PCI bus id."""
    from vmgpu import gpu as gpu_mod

    rows = [g.__dict__ for g in gpu_mod.inventory(inventory)]

    def render(d):
        t = Table(title="GPUs" + (f" (declared in {inventory})" if inventory else " (NVML)"))
        for col in ("index", "uuid", "name", "memory", "pci bus id"):
            t.add_column(col)
        for g in d:
            t.add_row(str(g["index"]), g["uuid"], g["name"], f"{g['memory_mib']} MiB", g["pci_bus_id"])
        Console().print(t)

    _emit(rows, as_json, render)


_SOCKET = click.option(
    "--socket",
    "socket_path",
    envvar="VMGPU_SOCKET",
    default="/run/vmgpu/vmgpud.sock",
    show_default=True,
    help="vmgpud's unix socket.  [env: VMGPU_SOCKET]",
)


@cli.command("daemon")
@_SOCKET
@click.option(
    "--db",
    "db_path",
    envvar="VMGPU_DB",
    default="/var/lib/vmgpu/ledger.db",
    show_default=True,
    help="The admission ledger (SQLite).  [env: VMGPU_DB]",
)
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False),
    envvar="VMGPU_INVENTORY",
    help="A declared GPU inventory (TOML) instead of NVML.  [env: VMGPU_INVENTORY]",
)
@click.option(
    "--metrics-port",
    type=int,
    default=9400,
    show_default=True,
    help="Prometheus metrics on 127.0.0.1:PORT (0: any free port; -1: none).",
)
def daemon(socket_path, db_path, inventory, metrics_port):
    """Run vmgpud in the foreground: the ledger, on a unix socket (JSON logs on stderr)."""
    from vmgpu import daemon as daemon_mod
    from vmgpu.logging import configure

    configure(json=True)
    daemon_mod.run(socket_path, db_path, inventory, None if metrics_port < 0 else metrics_port)


@cli.command("admit")
@click.argument("guest", callback=_guest)
@click.argument("spec")
@click.option(
    "--kind",
    type=click.Choice(["vm", "container", "process"]),
    default="process",
    show_default=True,
    help="What the guest is.",
)
@_SOCKET
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def admit(guest, spec, kind, socket_path, as_json):
    """Reserve a share for GUEST, all slices or none.  SPEC: "gpu=0,mem=8G,compute=50;gpu=1,..."."""
    from vmgpu.client import Client

    reply = Client(socket_path).admit(guest, kind, spec)
    rows = [
        {"gpu": s.gpu_index, "uuid": s.gpu_uuid, "mem_mib": s.mem_mib, "compute_pct": s.compute_pct}
        for s in reply.slices
    ]

    def render(d):
        t = Table(title=f"admitted {guest}")
        for col in ("gpu", "uuid", "memory", "compute"):
            t.add_column(col)
        for r in d:
            t.add_row(str(r["gpu"]), r["uuid"], f"{r['mem_mib']} MiB", f"{r['compute_pct']}%")
        Console().print(t)

    _emit(rows, as_json, render)


@cli.command("release")
@click.argument("guest", callback=_guest)
@_SOCKET
def release(guest, socket_path):
    """Free everything GUEST holds (nothing to free is not an error)."""
    from vmgpu.client import Client

    held = Client(socket_path).release(guest)
    click.echo(f"released {guest}" if held else f"{guest} held nothing")


@cli.group(cls=_Group)
def forwarder() -> None:
    """Forwarders: the host processes that serve a guest's region on its GPUs (via vmgpud)."""


@forwarder.command("start")
@click.argument("guest", callback=_guest)
@click.argument("region")
@click.option(
    "--backend",
    type=click.Choice(["cuda", "sim"]),
    default="cuda",
    show_default=True,
    help="sim: the simulated backend (tests only).",
)
@click.option("--size", default="", help="Create the region with this size (e.g. 1G); default: it exists.")
@_SOCKET
def forwarder_start(guest, region, backend, size, socket_path):
    """Serve the admitted GUEST's REGION with its quota.

    REGION is the region file, such as /dev/shm/vmgpu-GUEST (created with --size)."""
    from vmgpu.client import Client

    pid = Client(socket_path).start_forwarder(guest, region, backend, size)
    click.echo(f"forwarder for {guest} running (pid {pid})")


@forwarder.command("stop")
@click.argument("guest", callback=_guest)
@_SOCKET
def forwarder_stop(guest, socket_path):
    """Stop GUEST's forwarder (GUEST stays admitted)."""
    from vmgpu.client import Client

    stopped = Client(socket_path).stop_forwarder(guest)
    click.echo(f"forwarder for {guest} stopped" if stopped else f"{guest} had no forwarder")


def _achieved(uuids: set[str], sample_s: float = 0.3) -> dict[tuple[str, str], float]:
    """Each guest's share of each GPU's time over a short sample, from the schedulers' pages."""
    import time

    from vmgpu import sched

    pages = []
    for u in uuids:
        try:
            pages.append((u, sched.Page(sched.page_path(u))))
        except sched.SchedError:
            continue
    if not pages:
        return {}
    t0, before = time.monotonic_ns(), {(u, m.guest): m.used_ns for u, p in pages for m in p.members()}
    time.sleep(sample_s)
    t1, after = time.monotonic_ns(), {(u, m.guest): m.used_ns for u, p in pages for m in p.members()}
    for _, p in pages:
        p.close()
    return {k: 100 * (v - before.get(k, v)) / (t1 - t0) for k, v in after.items()}


@cli.command("weight")
@click.argument("guest", callback=_guest)
@click.argument("gpu")
@click.argument("weight", type=click.IntRange(1, 100))
@_SOCKET
def weight(guest, gpu, weight, socket_path):
    """Set GUEST's compute WEIGHT (1..100) on GPU (index or UUID), live.

    Under the weighted policy guests share a busy GPU in proportion to their weights; under
    fixed, the weight is the guest's cap in percent.  The default weight is the compute % of
    the guest's share spec."""
    from vmgpu.client import Client

    r = Client(socket_path).set_weight(guest, gpu, weight)
    click.echo(f"{guest} on {r.gpu_uuid}: weight {weight}" + ("" if r.live else " (from its forwarder's next start)"))


@cli.command("policy")
@click.argument("gpu")
@click.argument("name", type=click.Choice(["native", "equal", "preemptive", "weighted", "fixed"]))
@_SOCKET
def policy(gpu, name, socket_path):
    """Set GPU's (index or UUID) compute policy, live.

    \b
    native      no compute control
    equal       1/N of the time per guest, even when the others are idle
    preemptive  equal shares; an idle guest's time goes to busy ones
    weighted    shares by weight; an idle guest's time goes to busy ones (default)
    fixed       a hard cap of weight% per guest, even on an otherwise idle card"""
    from vmgpu.client import Client

    r = Client(socket_path).set_policy(gpu, name)
    click.echo(f"{r.gpu_uuid}: policy {name}" + ("" if r.live else " (from the next forwarder's start)"))


@cli.command("status")
@_SOCKET
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def status(socket_path, as_json):
    """Per GPU: memory and compute reserved and free, and its policy; per guest: its slices, with
    its memory in use, its compute weight and the share of GPU time it gets now."""
    from vmgpu.client import Client

    reply = Client(socket_path).status()
    achieved = _achieved({g.uuid for g in reply.gpus})
    data = {
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "mem_mib": g.mem_mib,
                "mem_reserved_mib": g.mem_reserved_mib,
                "compute_reserved_pct": g.compute_reserved_pct,
                "policy": g.policy,
            }
            for g in reply.gpus
        ],
        "guests": [
            {
                "guest": s.guest,
                "kind": s.kind,
                "gpu": s.gpu_index,
                "mem_mib": s.mem_mib,
                "compute_pct": s.compute_pct,
                "weight": s.weight,
                "compute_achieved_pct": achieved.get((s.gpu_uuid, s.guest)),
            }
            for s in reply.slices
        ],
        "forwarders": [
            {
                "guest": f.guest,
                "pid": f.pid,
                "region": f.region,
                "backend": f.backend,
                "mem_used_mib": list(f.mem_used_mib),
                "processes": f.processes,
                "sync_calls": f.sync_calls,
                "async_calls": f.async_calls,
                "state": f.state or "running",
                "restart_attempt": f.restart_attempt,
                "restart_error": f.restart_error,
            }
            for f in reply.forwarders
        ],
    }

    def render(d):
        con = Console()
        t = Table(title="GPUs")
        for col in ("gpu", "name", "memory reserved", "memory free", "compute reserved", "policy"):
            t.add_column(col)
        for g in d["gpus"]:
            t.add_row(
                str(g["index"]),
                g["name"],
                f"{g['mem_reserved_mib']} / {g['mem_mib']} MiB",
                f"{g['mem_mib'] - g['mem_reserved_mib']} MiB",
                f"{g['compute_reserved_pct']}%",
                g["policy"],
            )
        con.print(t)
        t = Table(title="guests")
        for col in ("guest", "kind", "gpu", "memory used / quota", "compute (weight) / now", "forwarder"):
            t.add_column(col)
        fwd = {f["guest"]: f for f in d["forwarders"]}
        nth: dict[str, int] = {}
        for s in d["guests"]:
            f = fwd.get(s["guest"])
            k = nth[s["guest"]] = nth.get(s["guest"], -1) + 1  # slices come in the forwarder's GPU order
            used = f["mem_used_mib"][k] if f and k < len(f["mem_used_mib"]) else None
            t.add_row(
                s["guest"],
                s["kind"],
                str(s["gpu"]),
                f"{used if used is not None else '-'} / {s['mem_mib']} MiB",
                f"{s['compute_pct']}% ({s['weight']}) / "
                + ("-" if s["compute_achieved_pct"] is None else f"{s['compute_achieved_pct']:.0f}%"),
                _forwarder_cell(f),
            )
        con.print(t)
        for f in d["forwarders"]:  # why a guest has no forwarder, unwrapped
            if f["state"] == "restarting" and f["restart_error"]:
                click.echo(f"{f['guest']}: no forwarder, restart attempt {f['restart_attempt']}: {f['restart_error']}")

    _emit(data, as_json, render)


def _forwarder_cell(f: dict | None) -> str:
    """What serves a guest now: its forwarder's pid, a restart under way, or none."""
    if f is None:
        return "none"
    if f["state"] == "restarting":
        return f"restarting (attempt {f['restart_attempt']})"
    if f["state"] == "stopped":
        return f"none (pid {f['pid']} exited; restarting)"
    return f"pid {f['pid']} ({f['backend']}), {f['processes']} process(es) served"


@cli.command("breakdown")
@click.argument("stats_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--interval", type=float, default=0.0, help="Report only what happens in the next N seconds.")
@click.option("--top", type=int, default=10, show_default=True, help="How many functions to list.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def breakdown(stats_file, interval, top, as_json):
    """Where a guest's time goes: calls crossed (sync/async), bytes copied, forwarder busy
    time, and the top functions by count and by time.  STATS_FILE is a forwarder's --stats."""
    import time as _time

    from vmgpu import stats

    a = stats.read(stats_file)
    if interval > 0:
        _time.sleep(interval)
        d = stats.delta(a, stats.read(stats_file))
    else:
        d = {**a, "seconds": None}

    def render(d):
        con = Console()
        span = f"in {d['seconds']:.2f} s" if d["seconds"] else "since the forwarder started"
        con.print(
            f"{span}: {d['sync_calls']} sync calls (a round trip each), {d['async_calls']} async; "
            f"forwarder busy {d['busy_ns'] / 1e9:.3f} s; copied {d['htod_bytes'] >> 20} MiB to and "
            f"{d['dtoh_bytes'] >> 20} MiB from the GPU; {d['processes']} process(es)"
        )
        for title, key in (("by count", "count"), ("by time", "ns")):
            t = Table(title=f"top functions {title}")
            for col in ("function", "calls", "time (ms)", "µs per call"):
                t.add_column(col)
            for name, v in sorted(d["ops"].items(), key=lambda kv: -kv[1][key])[:top]:
                t.add_row(name, str(v["count"]), f"{v['ns'] / 1e6:.2f}", f"{v['ns'] / 1e3 / v['count']:.2f}")
            con.print(t)

    _emit(d, as_json, render)


_CONNECT = click.option(
    "--connect",
    "-c",
    "uri",
    envvar="LIBVIRT_DEFAULT_URI",
    default="qemu:///system",
    show_default=True,
    help="libvirt connection URI.  [env: LIBVIRT_DEFAULT_URI]",
)


@cli.group(cls=_Group)
def vm() -> None:
    """libvirt domains: give one a GPU share, take it away, show it (edits the persistent
    definition; a running domain gets it at its next start)."""


def _vm_render(d):
    t = Table(title=f"domain {d['domain']} ({'running' if d['running'] else 'not running'})")
    for col in ("gpu", "memory", "compute"):
        t.add_column(col)
    for s in d["slices"]:
        t.add_row(s["gpu"], s["mem"], f"{s['compute']}%")
    Console().print(t)
    r = d["region"]
    if r:
        click.echo(f"region device: <shmem name='{r['name']}'> {r['model']}, {r['size_mib']:g} MiB")
    if d["problem"]:
        click.echo(f"problem: {d['problem']}")
    elif not d["slices"]:
        click.echo("no vmgpu share")


@vm.command("attach")
@click.argument("domain_name", metavar="DOMAIN", callback=lambda c, p, v: names.check_guest(v, "domain name"))
@click.option("--gpu", help="GPU index or UUID (one slice; use --spec for several).")
@click.option("--mem", help="Memory: MiB, with a unit (8G), or a share of the card (25%).")
@click.option("--compute", type=int, default=100, show_default=True, help="Compute share in percent.")
@click.option("--spec", "spec_text", help='The whole share instead: "gpu=0,mem=8G,compute=50;gpu=1,...".')
@click.option("--heap", default="256M", show_default=True, help="Pinned host memory for the guest (sizes the region).")
@_CONNECT
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def vm_attach(domain_name, gpu, mem, compute, spec_text, heap, uri, as_json):
    """Give DOMAIN a GPU share and its shared-memory region device (replaces an earlier one)."""
    from vmgpu import spec as spec_mod
    from vmgpu.errors import InvalidArgument
    from vmgpu.virt.libvirt_domains import Domains

    if spec_text and (gpu or mem):
        raise InvalidArgument("give either --spec or --gpu/--mem/--compute, not both")
    if not spec_text:
        if gpu is None or mem is None:
            raise InvalidArgument("give --gpu and --mem (or --spec)")
        spec_text = f"gpu={gpu},mem={mem},compute={compute}"
    share = spec_mod.parse(spec_text)
    with Domains(uri) as doms:
        out = doms.attach(domain_name, share, shm.parse_size(heap) >> 20)
    _emit(out, as_json, _vm_render)


@vm.command("detach")
@click.argument("domain_name", metavar="DOMAIN")
@_CONNECT
def vm_detach(domain_name, uri):
    """Take DOMAIN's GPU share and region device away."""
    from vmgpu.virt.libvirt_domains import Domains

    with Domains(uri) as doms:
        had = doms.detach(domain_name)
    click.echo(f"detached vmgpu from {domain_name}" if had else f"{domain_name} had no vmgpu share")


@vm.command("show")
@click.argument("domain_name", metavar="DOMAIN")
@_CONNECT
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def vm_show(domain_name, uri, as_json):
    """DOMAIN's GPU share and region device as defined, and what is wrong with them if anything."""
    from vmgpu.virt.libvirt_domains import Domains

    with Domains(uri) as doms:
        out = doms.show(domain_name)
    _emit(out, as_json, _vm_render)


_STARTS_BACKEND = click.option(
    "--backend",
    type=click.Choice(["cuda", "sim"]),
    default="cuda",
    show_default=True,
    help="Backend of the forwarders it starts (sim: tests only).",
)


@cli.group(cls=_Group)
def hooks() -> None:
    """The libvirt qemu hook that admits, starts, stops and releases vmgpu guests."""


@hooks.command("install")
@click.option("--dir", "hooks_dir", default="/etc/libvirt/hooks", show_default=True, help="libvirt's hooks directory.")
@_SOCKET
@_STARTS_BACKEND
@click.option("--log", "log_path", default="/var/log/vmgpu/hook.log", show_default=True, help="The hook's JSON log.")
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
@click.option("--dir", "hooks_dir", default="/etc/libvirt/hooks", show_default=True, help="libvirt's hooks directory.")
def hooks_uninstall(hooks_dir):
    """Remove the hook (guests already running keep their forwarders)."""
    from vmgpu.virt import hook

    click.echo("removed the vmgpu hook" if hook.uninstall(hooks_dir) else "no vmgpu hook was installed")


@cli.group(cls=_Group)
def runtime() -> None:
    """The OCI runtime for docker: `docker run --runtime=vmgpu -e VMGPU="gpu=0,mem=4G" ...`."""


@runtime.command("install")
@click.option(
    "--path",
    "script_path",
    default="/usr/local/bin/vmgpu-container-runtime",
    show_default=True,
    help="Where to write the runtime.",
)
@click.option(
    "--daemon-json",
    default="/etc/docker/daemon.json",
    show_default=True,
    help="docker's daemon.json, where the runtime is registered as 'vmgpu' ('' leaves it alone).",
)
@_SOCKET
@_STARTS_BACKEND
@click.option("--runc", default="runc", show_default=True, help="The runc it runs containers with.")
def runtime_install(script_path, daemon_json, socket_path, backend, runc):
    """Install the runtime and register it with docker (then restart dockerd or send it SIGHUP)."""
    from vmgpu import oci

    out = oci.install(script_path, {"socket": socket_path, "backend": backend, "runc": runc}, daemon_json or None)
    click.echo(f"installed {out['path']}")
    if out["daemon_json"]:
        click.echo(f"registered as runtime 'vmgpu' in {out['daemon_json']}: restart dockerd or send it SIGHUP")


@cli.command("doctor")
@_SOCKET
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def doctor(socket_path, as_json):
    """Check this host for vmgpu: driver, NVML, native parts, /dev/shm, vmgpud, libvirt.

    Each line says what is wrong and how to fix it.  Exits 1 if a check failed."""
    from vmgpu.doctor import run_doctor

    checks = run_doctor(socket_path)

    def render(d):
        t = Table(title="vmgpu doctor")
        for col in ("check", "status", "detail", "fix"):
            t.add_column(col)
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in d:
            t.add_row(c["name"], f"[{colour[c['status']]}]{c['status']}[/]", c["detail"], c["fix"])
        Console().print(t)

    _emit(checks, as_json, render)
    if any(c["status"] == "fail" for c in checks):
        sys.exit(1)


@cli.command("demo")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cuda", "sim"]),
    default="auto",
    show_default=True,
    help="cuda: this host's GPU; sim: the simulated backend (tests only); auto: cuda if a GPU is here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def demo(backend, as_json):
    """Run unchanged CUDA programs through vmgpu on this host.

    Starts a forwarder on a fresh region in /dev/shm, runs a driver-API program and an
    nvcc-built vector add with vmgpu's libcuda.so.1, and shows what the forwarder did.
    Needs `make native cuda-programs`.  Exits 1 if a program failed.
    """
    result = run_demo(backend)

    def render(d):
        con = Console()
        if d["simulated"]:
            con.print("[yellow]No GPU here: the forwarder runs the SIMULATED backend (for tests only).[/]")
        t = Table(title=f"vmgpu demo on {d['device']}")
        for col in ("program", "result", "seconds"):
            t.add_column(col)
        for r in d["programs"]:
            t.add_row(
                r["program"], "[green]ok[/]" if r["ok"] else f"[red]failed[/] {r['detail']}", f"{r['seconds']:.2f}"
            )
        con.print(t)
        con.print("[dim]forwarder log:[/]")
        for line in d["forwarder_log"]:
            con.print(Text("  " + line, style="dim"), highlight=False)

    _emit(result, as_json, render)
    if not all(r["ok"] for r in result["programs"]):
        sys.exit(1)


def main() -> None:
    cli(prog_name="vmgpu")


if __name__ == "__main__":
    main()
