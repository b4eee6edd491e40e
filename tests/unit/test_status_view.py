"""What `vmgpu` prints for an operator: full GPU UUIDs wherever the output is not a terminal
(a pipe, a file, a script) and with --wide on a narrow one; `vmgpu top --once` against an
in-process vmgpud.  (A busy guest's share of GPU time: tests/native/test_status_sim.py.)"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from tests.forwarder import stop_server
from tests.unit.test_daemon import INVENTORY
from vmgpu.cli.main import cli
from vmgpu.daemon import serve

UUID = "GPU-00000001-0000-0000-0000-000000000000"


@pytest.fixture
def daemon(tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    server, ledger = serve(tmp_path / "run" / "vmgpud.sock", tmp_path / "ledger.db", inv)
    yield str(tmp_path / "run" / "vmgpud.sock"), str(inv)
    stop_server(server, ledger)


def _run(*args: str, env: dict | None = None):
    r = CliRunner(mix_stderr=False).invoke(cli, list(args), env=env)
    assert r.exit_code == 0, r.output + r.stderr
    return r.output


def test_tables_off_a_terminal_hold_full_uuids_however_narrow_the_columns(daemon):
    sock, inv = daemon
    for out in (
        _run("gpus", "--inventory", inv, env={"COLUMNS": "40"}),
        _run("admit", "g", "gpu=1,mem=1G", "--socket", sock, env={"COLUMNS": "40"}),
        _run("status", "--wide", "--socket", sock, env={"COLUMNS": "40"}),
    ):
        assert UUID in out and "…" not in out, out


def test_on_a_narrow_terminal_wide_gives_the_full_uuids_that_the_fitted_table_cuts(daemon):
    _, inv = daemon
    # rich takes these for a 60-column terminal (TERM too: under TERM=dumb it is no terminal)
    narrow = {"COLUMNS": "60", "FORCE_COLOR": "1", "TERM": "xterm"}
    fitted = _run("gpus", "--inventory", inv, env=narrow)
    assert UUID not in fitted, fitted  # the terminal's width wins without --wide
    assert UUID in _run("gpus", "--inventory", inv, "--wide", env=narrow)


def test_status_shows_uuids_with_wide_and_json_always(daemon):
    sock, _ = daemon
    assert UUID not in _run("status", "--socket", sock)
    assert UUID in _run("status", "--wide", "--socket", sock)
    assert json.loads(_run("status", "--json", "--socket", sock))["gpus"][1]["uuid"] == UUID


def test_top_once_prints_one_frame_of_every_guest_and_json_needs_once(daemon):
    sock, _ = daemon
    _run("admit", "vm1", "gpu=0,mem=2G,compute=40", "--kind", "vm", "--socket", sock)
    frame = json.loads(_run("top", "--once", "--interval", "0.1", "--json", "--socket", sock))
    (g,) = frame["guests"]
    assert (g["guest"], g["mem_mib"], g["weight"], g["compute_achieved_pct"]) == ("vm1", 2048, 40, None)
    assert frame["interval_s"] == 0.1 and frame["forwarders"] == []
    out = _run("top", "--once", "--interval", "0.1", "--socket", sock)
    assert "vm1" in out and "- / 2048 MiB" in out and "weighted" in out, out
    r = CliRunner(mix_stderr=False).invoke(cli, ["top", "--json", "--socket", sock])
    assert r.exit_code == 2 and "--once" in r.stderr, r.stderr


HOSTILE_LABEL = "\x1b[2J\x1b]0;owned\x07web\u202e-1[red]x[/red]\u200b\r\n" + "y" * 200


def test_a_label_reaches_the_terminal_without_control_characters_markup_or_its_length(daemon):
    from vmgpu import config
    from vmgpu.client import Client

    sock, _ = daemon
    Client(sock).admit("ctr-0123456789ab", "container", "gpu=0,mem=1G", label=HOSTILE_LABEL)
    (s,) = json.loads(_run("status", "--json", "--socket", sock))["guests"]
    assert s["label"] == config.label_text(HOSTILE_LABEL)
    assert s["label"].startswith("[2J]0;ownedweb-1[red]x[/red] yyy") and len(s["label"]) == config.LABEL_MAX
    for out in (_run("status", "--socket", sock), _run("top", "--once", "--interval", "0.1", "--socket", sock)):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\u200b" not in out, repr(out)
        assert "[red]x[/red]" in out, out  # shown as it is, never taken as rich's markup
        assert "(ctr-0123456789ab)" in out, out


def test_status_shows_the_host_settings_and_what_a_guest_without_a_forwarder_asks_for(tmp_path):
    from vmgpu.client import Client
    from vmgpu.supervisor import HostSettings

    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    scripts = tmp_path / "oom"
    scripts.mkdir(mode=0o755)
    (scripts / "page-me").write_text("#!/bin/sh\n")
    (scripts / "page-me").chmod(0o755)
    sock = tmp_path / "run" / "vmgpud.sock"
    server, ledger = serve(sock, tmp_path / "ledger.db", inv, settings=HostSettings(str(scripts), "", 256 << 20, 12))
    try:
        Client(str(sock)).admit("vm1", "vm", "gpu=0,mem=1G;oom-script=page-me,peer-timeout=60")
        out = _run("status", "--socket", str(sock))
        assert (
            f"forwarder settings (host): oom script none, ctx reserve 256 MiB, peer timeout 12 s; OOM scripts in "
            f"{scripts}" in out
        ), out
        assert "vm1: asks oom-script=page-me,peer-timeout=60 (its forwarder will be started with it)" in out, out
        st = json.loads(_run("status", "--json", "--socket", str(sock)))
        assert st["settings"] == {
            "oom_scripts_dir": str(scripts),
            "oom_script": "",
            "ctx_reserve_bytes": 256 << 20,
            "peer_timeout_s": 12,
            "mps_dir": None,  # (no --mps: tests/unit/test_mps.py)
            "mps_pid": None,
        }
    finally:
        stop_server(server, ledger)


def test_under_shared_a_held_column_shows_what_the_controller_holds_each_guest_to():
    from rich.console import Console

    from vmgpu.cli import render

    g = {"guest": "a", "kind": "vm", "gpu": 0, "mem_mib": 1024, "compute_pct": 30, "weight": 30}
    g |= {"guarantee_pct": 0, "cap_pct": 0, "priority": "normal", "compute_achieved_pct": None}
    g |= {"label": "", "settings": ""}
    gpu = {"index": 0, "uuid": UUID, "name": "H100", "mem_mib": 81559, "mem_reserved_mib": 2048}
    gpu |= {"compute_reserved_pct": 0, "policy": "shared"}
    d = {"gpus": [gpu], "forwarders": [], "interval_s": 1.0}
    d["guests"] = [
        {**g, "held_pct": 45.0, "held_depth": 8},
        {**g, "guest": "b", "held_pct": 0.0, "held_depth": None, "held_sms_pct": 77.5},
        {**g, "guest": "c", "held_pct": 40.0, "held_depth": None, "held_off_span": True},
    ]

    def text(table) -> str:
        con = Console(record=True, width=200)
        con.print(table)
        return con.export_text()

    out = text(render.top_frame(d))
    assert "held" in out and "45%, depth 8" in out, out
    row_b = next(line for line in out.splitlines() if "│ b " in line)
    assert " 0%, on 78% of SMs " in row_b, out  # (on a span of the SMs: the sms lever)
    row_c = next(line for line in out.splitlines() if "│ c " in line)
    assert " 40%, off its span " in row_c, out  # (its work left its span: all held by time)
    # off shared (held_pct None everywhere) no such column
    d["guests"] = [{**g, "held_pct": None, "held_depth": None}]
    d["gpus"][0]["policy"] = "weighted"
    assert "held" not in text(render.top_frame(d))


def test_the_sampler_reads_a_guests_hold_depth_and_span_off_a_shared_page(monkeypatch):
    from vmgpu import reports, sched
    from vmgpu.sched import Member

    class Page:  # the parts of vmgpu.sched.Page the sampler reads
        policy, sm_groups = "shared", 15

        def __init__(self, path):
            pass

        def caps_fresh(self, probe=False):
            return False

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def members(self):
            now_ms = int(1000 * time.monotonic()) & 0xFFFFFFFF
            return [
                Member(0, "a", 1, 30, 0, 0, 0, 1, hold=250, sm_part=0 << 16 | 52),
                Member(1, "b", 2, 70, 0, 0, 0, 1, depth=8, sm_part=52 << 16 | 240),
                Member(2, "c", 3, 70, 0, 0, 0, 1, whole_ms=now_ms - 300),  # (off its span 0.3 s ago)
                Member(3, "d", 4, 70, 0, 0, 0, 1, whole_ms=now_ms - 5000),  # (5 s ago: no longer)
            ]

    monkeypatch.setattr(sched, "Page", Page)
    s = reports.ComputeSampler([UUID])
    s.take()
    a, b, c, d = (s.held[(UUID, n)] for n in "abcd")
    assert a == (25.0, None, 100 * 52 / 240, False) and b == (0.0, 8, 100 * 188 / 240, False), s.held
    assert c == (0.0, None, None, True), s.held  # no span: the whole GPU, its work off its span
    assert d == (0.0, None, None, False), s.held
    Page.sm_groups = 0  # (not partitioned at all: every forwarder says so, nobody is named)
    s.take()
    assert s.held[(UUID, "c")][3] is False, s.held


def test_a_cap_the_cap_controller_holds_shows_the_part_of_the_time_it_lets_the_guest_have(monkeypatch):
    """The sampler reads each capped guest's cap_pm while the controller's looks are fresh (not
    after: the forwarders then hold the cap% itself), and the table shows it by the cap."""
    from vmgpu import reports, sched
    from vmgpu.cli import render
    from vmgpu.sched import Member

    fresh = [True]

    class Page:
        policy, sm_groups = "weighted", 0

        def __init__(self, path):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def caps_fresh(self, probe=False):
            return fresh[0]

        def gpu_time(self):
            return 1, {}

        def members(self):
            return [
                Member(0, "a", 1, 100, 0, 0, 0, 1, cap=50, cap_pm=473),
                Member(1, "b", 2, 100, 0, 0, 0, 1, cap=10),
                Member(2, "c", 3, 30, 0, 0, 0, 1, cap_pm=250),  # (under fixed its weight is a cap)
            ]

    monkeypatch.setattr(sched, "Page", Page)
    s = reports.ComputeSampler([UUID])
    s.take()
    # (c's part is a stray one under weighted, where c is not capped: the forwarders do not take it)
    assert s.cap_parts == {(UUID, "a"): 47.3}, s.cap_parts
    Page.policy = "fixed"
    s.take()
    assert s.cap_parts == {(UUID, "a"): 47.3, (UUID, "c"): 25.0}, s.cap_parts
    Page.policy = "weighted"
    fresh[0] = False
    s.take()
    assert s.cap_parts == {}, s.cap_parts

    g = {"weight": 100, "guarantee_pct": 0, "cap_pct": 50, "priority": "normal", "cap_part_pct": 47.3}
    assert render.share_cells(g) == ("100", "-", "50% (47.3% of the time)", "normal")
    assert render.cap_cell({**g, "cap_pct": 10, "cap_part_pct": 100.0}) == "10% (measuring)"
    assert render.cap_cell({**g, "cap_part_pct": None}) == "50%"  # (held by time)
    assert render.cap_cell({**g, "cap_pct": 0, "cap_part_pct": None}) == "-"
    # under fixed a weight is a cap too: held by the controller without a cap of its own
    assert render.cap_cell({**g, "cap_pct": 0, "cap_part_pct": 27.34}) == "its weight (27.3% of the time)"


def test_a_pages_cap_looks_are_fresh_for_two_seconds_across_the_clocks_wrap():
    from vmgpu import abi, sched

    page = sched.Page.__new__(sched.Page)
    page.page = abi.SchedPage()
    assert not page.caps_fresh(100.0)  # never looked
    page.mark_caps_look(100.0)
    assert page.caps_fresh(100.0) and page.caps_fresh(101.9) and not page.caps_fresh(102.1)
    wrap = 2**32 / 1000  # (the low 32 bits of the monotonic clock in ms wrap every 49.7 days)
    page.mark_caps_look(wrap - 0.5)
    assert page.caps_fresh(wrap + 1.0) and not page.caps_fresh(wrap + 2.0)
    assert page.caps_fresh(wrap + 0.4, probe=True) and not page.caps_fresh(wrap + 0.6, probe=True)  # (1 s for a probe)


def test_a_cap_part_is_stored_only_while_the_slot_is_still_the_members_forwarders():
    from vmgpu import abi, sched

    page = sched.Page.__new__(sched.Page)
    page.page = abi.SchedPage()
    page.page.slot[2].pid = 41
    assert page.set_cap_pm(2, 300, 41) and page.page.slot[2].cap_pm == 300
    page.page.slot[2].pid = 42  # (its guest left, and another forwarder was seated in the slot)
    assert not page.set_cap_pm(2, 100, 41) and page.page.slot[2].cap_pm == 300
    assert page.set_cap_pm(2, 0) and page.page.slot[2].cap_pm == 0  # (no pid: as before)
