"""What `vmgpu` prints for an operator: full GPU UUIDs wherever the output is not a terminal
(a pipe, a file, a script) and with --wide on a narrow one; `vmgpu top --once` against an
in-process vmgpud.  (A busy guest's share of GPU time: tests/native/test_status_sim.py.)"""

from __future__ import annotations

import json

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
    narrow = {"COLUMNS": "60", "FORCE_COLOR": "1"}  # rich takes these for a 60-column terminal
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
