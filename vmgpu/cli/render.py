"""How `vmgpu` prints what its commands return: JSON (--json) or a human's tables and lines.
Every table of the CLI is drawn here; the data comes from the library (vmgpu/reports.py,
vmgpu/regions.py, ...)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


def emit(data, as_json: bool, render, *args) -> None:
    """data as JSON, or render(data, *args)."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data, *args)


# Not on a terminal, or with --wide, a table is as wide as what it holds (rich would otherwise
# fit it to 80 columns, cutting GPU UUIDs and paths short).
UNBOUNDED = 1 << 16


def console(wide: bool = False) -> Console:
    """Where the tables go: on a terminal, fitted to its width (unless wide); anywhere else (a
    pipe, a file, a script) or with --wide, never a value cut short or wrapped."""
    con = Console()
    if wide or not con.is_terminal:
        return Console(width=UNBOUNDED)
    return con


def _table(title: str | None, columns) -> Table:
    t = Table(title=title)
    for col in columns:
        t.add_column(col)
    return t


GPU_COLUMNS = ("index", "uuid", "name", "memory", "pci bus id")


def region_created(d: dict) -> None:
    click.echo(
        f"created {d['path']}: {d['size']} bytes, {d['channels']} channels, "
        f"{d['heap_bytes'] >> 20} MiB pinned heap, wait mode {d['wait']}"
    )


def region(d: dict) -> None:
    h = d["header"]
    con = console()
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


def selftest(d: dict) -> None:
    t = Table("check", "result")
    for k, v in d["checks"].items():
        t.add_row(k, "[green]ok[/]" if v else "[red]FAILED[/]")
    console().print(t)
    click.echo(
        f"{d['exchanges']} round trips in {d['seconds']:.3f} s "
        f"({d['exchanges'] / d['seconds']:.0f}/s through the Python binding)"
    )


def gpus(d: list[dict], inventory: str | None, wide: bool = False) -> None:
    t = _table("GPUs" + (f" (declared in {inventory})" if inventory else " (NVML)"), GPU_COLUMNS)
    for g in d:
        t.add_row(str(g["index"]), g["uuid"], g["name"], f"{g['memory_mib']} MiB", g["pci_bus_id"])
    console(wide).print(t)


def share_cells(s: dict) -> tuple[str, str, str, str]:
    """weight, guarantee, cap, priority as a table shows them ("-": none); a cap the cap controller
    holds now with the part of each period it lets the guest have."""
    return (
        str(s["weight"]),
        f"{s['guarantee_pct']}%" if s["guarantee_pct"] else "-",
        cap_cell(s),
        s["priority"],
    )


def cap_cell(s: dict) -> str:
    """A cap, and where vmgpud's cap controller holds it (cap_part_pct) the part of each period the
    guest's work may have so that its throughput is the cap's part of its rate alone ("measuring"
    while its cap is lifted to read that rate).  Under the fixed policy a guest's weight is a cap
    too: one with no cap of its own that the controller holds shows "its weight (...)"."""
    part = s.get("cap_part_pct")
    holds = "" if part is None else f" ({'measuring' if part >= 100 else f'{part:.1f}% of the time'})"
    if not s["cap_pct"]:
        return f"its weight{holds}" if holds else "-"
    return f"{s['cap_pct']}%{holds}"


def admitted(d: list[dict], guest: str, wide: bool = False) -> None:
    t = _table(f"admitted {guest}", ("gpu", "uuid", "memory", "weight", "guarantee", "cap", "priority"))
    for r in d:
        t.add_row(str(r["gpu"]), r["uuid"], f"{r['mem_mib']} MiB", *share_cells(r))
    console(wide).print(t)


def status(d: dict, wide: bool = False) -> None:
    con = console(wide)
    columns = ("gpu", *(("uuid",) if wide else ()), "name", "memory reserved", "memory free", "compute guaranteed")
    t = _table("GPUs", (*columns, "policy"))
    for g in d["gpus"]:
        t.add_row(
            str(g["index"]),
            *((g["uuid"],) if wide else ()),
            g["name"],
            f"{g['mem_reserved_mib']} / {g['mem_mib']} MiB",
            f"{g['mem_mib'] - g['mem_reserved_mib']} MiB",
            f"{g['compute_reserved_pct']}%",
            g["policy"],
        )
    con.print(t)
    share_columns = ("weight", "guarantee", "cap", "priority")
    held = any_held(d)  # (a column only where a GPU is under shared)
    t = _table(
        "guests",
        ("guest", "kind", "gpu", "memory used / quota", *share_columns, "compute now", *(("held",) if held else ()))
        + ("forwarder",),
    )
    for s, f, used in guest_slices(d):
        t.add_row(
            guest_cell(s),
            s["kind"],
            str(s["gpu"]),
            f"{used if used is not None else '-'} / {s['mem_mib']} MiB",
            *share_cells(s),
            percent(s["compute_achieved_pct"]),
            *((held_cell(s),) if held else ()),
            forwarder_cell(f),
        )
    con.print(t)
    for f in d["forwarders"]:  # why a guest has no forwarder, unwrapped
        if f["state"] == "restarting" and f["restart_error"]:
            click.echo(f"{f['guest']}: no forwarder, restart attempt {f['restart_attempt']}: {f['restart_error']}")
    settings(d)


def settings_text(oom_script: str, ctx_reserve_bytes: int | None, peer_timeout_s: int | None) -> str:
    """Managed settings as a line shows them ("default": the forwarder's own)."""
    ctx = "default" if ctx_reserve_bytes is None else f"{ctx_reserve_bytes >> 20} MiB"
    peer = "default" if peer_timeout_s is None else f"{peer_timeout_s} s"
    return f"oom script {oom_script or 'none'}, ctx reserve {ctx}, peer timeout {peer}"


def settings(d: dict) -> None:
    """The forwarders' managed settings: the host's, then what each guest's forwarder was started
    with, and what a guest without one asked for (applied when it starts)."""
    h = d.get("settings")
    if h:
        click.echo(
            f"forwarder settings (host): {settings_text(h['oom_script'], h['ctx_reserve_bytes'], h['peer_timeout_s'])}"
            f"; OOM scripts in {h['oom_scripts_dir'] or '-'}"
        )
        if h.get("mps_dir"):
            daemon = f"pid {h['mps_pid']}" if h.get("mps_pid") else "NOT RUNNING (vmgpud starts it again)"
            click.echo(f"MPS control daemon (shared GPUs' guests): {h['mps_dir']}, {daemon}")
    running = {f["guest"] for f in d["forwarders"]}
    for f in d["forwarders"]:
        click.echo(
            f"  {f['guest']} (pid {f['pid']}): "
            f"{settings_text(f['oom_script'], f['ctx_reserve_bytes'], f['peer_timeout_s'])}"
        )
    asked = {s["guest"]: s["settings"] for s in d["guests"] if s.get("settings") and s["guest"] not in running}
    for guest, text in asked.items():
        click.echo(f"  {guest}: asks {text} (its forwarder will be started with it)")


def guest_slices(d: dict):
    """(slice, its guest's forwarder or None, the slice's memory in use in MiB or None) for
    each guest slice of a status (reports.status)."""
    fwd = {f["guest"]: f for f in d["forwarders"]}
    nth: dict[str, int] = {}
    for s in d["guests"]:
        f = fwd.get(s["guest"])
        k = nth[s["guest"]] = nth.get(s["guest"], -1) + 1  # slices come in the forwarder's GPU order
        yield s, f, (f["mem_used_mib"][k] if f and k < len(f["mem_used_mib"]) else None)


def guest_cell(s: dict) -> str:
    """A guest as the operator knows it: its label (a container's docker name) and the name
    vmgpu gave it."""
    from vmgpu.config import label_text

    label = label_text(s.get("label") or "")  # untrusted text: never a control character on a terminal
    return f"{escape(label)} ({s['guest']})" if label else s["guest"]  # and never rich markup


def percent(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def held_cell(s: dict) -> str:
    """What the shared policy's controller holds a guest to now: the % of each period its work
    waits, its depth where one is set, the part of the SMs its span is where it has one, and "off
    its span" where its work left its span (which has every guest on the GPU held by time) ("-"
    off shared)."""
    if s.get("held_pct") is None:
        return "-"
    depth = f", depth {s['held_depth']}" if s.get("held_depth") else ""
    sms = f", on {s['held_sms_pct']:.0f}% of SMs" if s.get("held_sms_pct") else ""
    off = ", off its span" if s.get("held_off_span") else ""
    return percent(s["held_pct"]) + depth + sms + off


def any_held(d: dict) -> bool:
    """Is a guest's GPU under the shared policy (a "held" column then shows its hold)?"""
    return any(s.get("held_pct") is not None for s in d["guests"])


def _bar(fraction: float | None, width: int = 10) -> str:
    if fraction is None:
        return " " * width
    n = round(max(0.0, min(1.0, fraction)) * width)
    return "\u2588" * n + "\u2591" * (width - n)


def top_frame(d: dict) -> Table:
    """One frame of `vmgpu top`: per guest and GPU, memory in use against the quota and the
    share of the GPU's time it held over the last interval (reports.top)."""
    policy = {g["index"]: g["policy"] for g in d["gpus"]}
    held = any_held(d)  # (a column only where a GPU is under shared)
    t = Table(
        title=f"vmgpu top: {len(d['gpus'])} GPU(s), {len({s['guest'] for s in d['guests']})} guest(s); "
        f"compute over the last {d['interval_s']:g} s",
        title_justify="left",
    )
    for col, just in (
        ("guest", "left"),
        ("kind", "left"),
        ("gpu", "right"),
        ("memory used / quota", "right"),
        ("", "left"),
        ("compute now", "right"),
        ("", "left"),
        *((("held", "right"),) if held else ()),
        ("weight", "right"),
        ("policy", "left"),
        ("procs", "right"),
        ("forwarder", "left"),
    ):
        t.add_column(col, justify=just, no_wrap=True)
    for s, f, used in guest_slices(d):
        now = s["compute_achieved_pct"]
        t.add_row(
            guest_cell(s),
            s["kind"],
            str(s["gpu"]),
            f"{used if used is not None else '-'} / {s['mem_mib']} MiB",
            _bar(None if used is None else used / s["mem_mib"]),
            percent(now),
            _bar(None if now is None else now / 100),
            *((held_cell(s),) if held else ()),
            str(s["weight"]),
            policy.get(s["gpu"], "-"),
            str(f["processes"]) if f else "-",
            "none" if f is None else ("running" if f["state"] == "running" else f["state"]),
        )
    if not t.row_count:
        t.caption = "no guest holds a share"
    return t


def top(d: dict, wide: bool = False) -> None:
    console(wide).print(top_frame(d))


def forwarder_cell(f: dict | None) -> str:
    """What serves a guest now: its forwarder's pid, a restart under way, or none."""
    if f is None:
        return "none"
    if f["state"] == "restarting":
        return f"restarting (attempt {f['restart_attempt']})"
    if f["state"] == "stopped":
        return f"none (pid {f['pid']} exited; restarting)"
    return f"pid {f['pid']} ({f['backend']}), {f['processes']} process(es) served"


def breakdown(d: dict, top: int) -> None:
    con = console()
    span = f"in {d['seconds']:.2f} s" if d["seconds"] else "since the forwarder started"
    con.print(
        f"{span}: {d['sync_calls']} sync calls (a round trip each), {d['async_calls']} async; "
        f"forwarder busy {d['busy_ns'] / 1e9:.3f} s; copied {d['htod_bytes'] >> 20} MiB to and "
        f"{d['dtoh_bytes'] >> 20} MiB from the GPU; {d['processes']} process(es)"
    )
    for title, key in (("by count", "count"), ("by time", "ns")):
        t = _table(f"top functions {title}", ("function", "calls", "time (ms)", "µs per call"))
        for name, v in sorted(d["ops"].items(), key=lambda kv: -kv[1][key])[:top]:
            t.add_row(name, str(v["count"]), f"{v['ns'] / 1e6:.2f}", f"{v['ns'] / 1e3 / v['count']:.2f}")
        con.print(t)


def vm(d: dict) -> None:
    t = _table(f"domain {d['domain']} ({'running' if d['running'] else 'not running'})", ("gpu", "memory", "share"))
    for s in d["slices"]:
        t.add_row(
            s["gpu"], s["mem"], ",".join(f"{k}={s[k]}" for k in ("weight", "guarantee", "cap", "priority") if k in s)
        )
    console().print(t)
    if d["slices"]:
        own = ", ".join(f"{k}={v}" for k, v in d["settings"].items())
        click.echo(f"settings: {own or 'none of its own'} (the rest: the host's)")
    r = d["region"]
    if r:
        click.echo(f"region device: <shmem name='{r['name']}'> {r['model']}, {r['size_mib']:g} MiB")
    if d["problem"]:
        click.echo(f"problem: {d['problem']}")
    elif not d["slices"]:
        click.echo("no vmgpu share")


def doctor(d: list[dict]) -> None:
    t = _table("vmgpu doctor", ("check", "status", "detail", "fix"))
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    for c in d:
        t.add_row(c["name"], f"[{colour[c['status']]}]{c['status']}[/]", c["detail"], c["fix"])
    console().print(t)


def demo(d: dict) -> None:
    con = console()
    if d["simulated"]:
        con.print("[yellow]No GPU here: the forwarder runs the SIMULATED backend (for tests only).[/]")
    t = _table(f"vmgpu demo on {d['device']}", ("program", "result", "seconds"))
    for r in d["programs"]:
        t.add_row(r["program"], "[green]ok[/]" if r["ok"] else f"[red]failed[/] {r['detail']}", f"{r['seconds']:.2f}")
    con.print(t)
    for line in d.get("skipped", ()):
        con.print(f"[yellow]not run:[/] {line}", highlight=False)
    con.print("[dim]forwarder log:[/]")
    for line in d["forwarder_log"]:
        con.print(Text("  " + line, style="dim"), highlight=False)


def pool_grant(d: dict, wide: bool = False) -> None:
    t = _table(f"pool slices of {d['guest']}", ("host", "data plane", "gpu", "uuid", "name", "memory", "compute"))
    for s in d["slices"]:
        t.add_row(
            s["host"],
            f"{s['address']}:{s['port']}",
            str(s["index"]),
            s["uuid"],
            s["name"],
            f"{s['mem_mib']} MiB",
            f"{s['compute_pct']}%",
        )
    con = console(wide)
    con.print(t)
    con.print(f"token: {d['token']}  (shown once; the hosts' forwarders ask for it)", highlight=False)


def pool_status(d: dict, wide: bool = False) -> None:
    con = console(wide)
    con.print(f"[bold]pool[/] {escape(d['pool'])}")
    t = _table("hosts", ("host", "data plane", "gpus", "lease left"))
    for h in d["hosts"]:
        left = f"{h['lease_left_s']} / {h['ttl_s']} s" if h["lease_left_s"] >= 0 else "expired"
        t.add_row(h["host"], f"{h['address']}:{h['port']}", str(len(h["gpus"])), left)
    con.print(t if t.row_count else "no host has joined (vmgpu pool join)")
    t = _table("GPUs", ("host", "gpu", *(("uuid",) if wide else ()), "name", "memory reserved", "compute", "guests"))
    for g in d["gpus"]:
        t.add_row(
            g["host"],
            str(g["index"]),
            *((g["uuid"],) if wide else ()),
            g["name"],
            f"{g['mem_reserved_mib']} / {g['mem_mib']} MiB",
            f"{g['compute_reserved_pct']}%",
            ", ".join(g["guests"]) or "-",
        )
    if t.row_count:
        con.print(t)
    t = _table("guests", ("guest", "host", "gpu uuid", "memory", "compute", "state"))
    for r in d["guests"]:
        for s in r["slices"]:
            t.add_row(
                r["guest"],
                s.get("host", "-"),
                s["uuid"],
                f"{s['mem_mib']} MiB" if "mem_mib" in s else "-",
                f"{s['compute_pct']}%" if "compute_pct" in s else "-",
                s["state"],
            )
    con.print(t if t.row_count else "no guest holds slices")
