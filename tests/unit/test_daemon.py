"""vmgpud on a temporary socket and database: the API through the client and the CLI,
errors that come back as the same error, an owner-only socket, and kill -9 of the daemon
in the middle of admissions and releases losing or doubling nothing."""

import contextlib
import json
import os
import random
import sqlite3
import stat
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tests.forwarder import start_daemon, stop_server, wait_for
from vmgpu.cli.main import cli
from vmgpu.client import Client
from vmgpu.daemon import serve
from vmgpu.errors import DaemonUnavailable, LedgerError, Refused
from vmgpu.spec import SpecError

INVENTORY = "".join(
    f'[[gpu]]\nindex = {i}\nuuid = "GPU-0000000{i}-0000-0000-0000-000000000000"\nname = "test"\nmemory = "32G"\n'
    for i in range(3)
)


@pytest.fixture
def host(tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    return tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db", inv


@pytest.fixture
def daemon(host):
    sock, db, inv = host
    server, ledger = serve(sock, db, inv)
    yield str(sock)
    stop_server(server, ledger)


def test_admit_status_release_through_the_client(daemon):
    c = Client(daemon)
    reply = c.admit("vm1", "vm", "gpu=0,mem=8G,compute=50,guarantee=50%;gpu=2,mem=25%,guarantee=100%")
    assert [(s.gpu_index, s.mem_mib, s.compute_pct) for s in reply.slices] == [(0, 8192, 50), (2, 8192, 100)]
    st = c.status()
    assert [(g.index, g.mem_reserved_mib, g.compute_reserved_pct) for g in st.gpus] == [
        (0, 8192, 50),
        (1, 0, 0),
        (2, 8192, 100),
    ]
    assert c.release("vm1") is True and c.release("vm1") is False
    assert all(g.mem_reserved_mib == 0 for g in c.status().gpus)


def test_errors_come_back_as_themselves(daemon):
    c = Client(daemon)
    c.admit("a", "vm", "gpu=1,mem=32G")
    with pytest.raises(Refused, match=r"GPU 1 .*memory: asked 1024 MiB, free 0 MiB"):
        c.admit("b", "container", "gpu=1,mem=1G")
    with pytest.raises(SpecError, match="slice 1: compute 110% is outside 1..100"):
        c.admit("c", "vm", "gpu=0,mem=1G,compute=110")


def test_socket_is_owner_only(daemon):
    assert stat.S_IMODE(os.stat(daemon).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(daemon)).st_mode) == 0o700


def test_cli_against_the_daemon(daemon):
    run = CliRunner(mix_stderr=False).invoke
    r = run(cli, ["admit", "c1", "gpu=0,mem=2G,compute=10", "--kind", "container", "--socket", daemon, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == [
        {
            "gpu": 0,
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "mem_mib": 2048,
            "compute_pct": 10,
            "weight": 10,
            "guarantee_pct": 0,
            "cap_pct": 0,
            "priority": "normal",
        }
    ]
    r = run(cli, ["status", "--socket", daemon, "--json"])
    guest = {"guest": "c1", "kind": "container", "gpu": 0, "mem_mib": 2048, "compute_pct": 10, "weight": 10}
    guest |= {"guarantee_pct": 0, "cap_pct": 0, "priority": "normal"}
    want = {
        **guest,
        "compute_achieved_pct": None,
        "held_pct": None,
        "held_depth": None,
        "held_sms_pct": None,
        "held_off_span": None,
        "cap_part_pct": None,
        "label": "",
        "settings": "",
    }
    assert json.loads(r.output)["guests"] == [want]  # no forwarder runs
    assert json.loads(r.output)["gpus"][0]["policy"] == "weighted"
    # compute weight and policy, kept by vmgpud (a forwarder started later gets them)
    r = run(cli, ["weight", "c1", "0", "40", "--socket", daemon])
    assert r.exit_code == 0 and "weight 40 (from its forwarder's next start)" in r.output, r.output
    r = run(cli, ["policy", "GPU-00000000-0000-0000-0000-000000000000", "fixed", "--socket", daemon])
    assert r.exit_code == 0 and "policy fixed" in r.output, r.output
    r = run(cli, ["policy", "1", "shared", "--socket", daemon])  # (no --mps: the operator is told what that means)
    assert r.exit_code == 0 and "vmgpud runs no MPS daemon (vmgpu daemon --mps DIR)" in r.output, r.output
    # cap and priority, the same way
    r = run(cli, ["cap", "c1", "0", "25%", "--socket", daemon])
    assert r.exit_code == 0 and "c1 on GPU-00000000-0000-0000-0000-000000000000: cap 25% (from" in r.output, r.output
    r = run(cli, ["priority", "c1", "0", "HIGH", "--socket", daemon])
    assert r.exit_code == 0 and "priority high (from its forwarder's next start)" in r.output, r.output
    r = run(cli, ["status", "--socket", daemon, "--json"])
    (g,) = json.loads(r.output)["guests"]
    assert (g["weight"], g["cap_pct"], g["priority"]) == (40, 25, "high")
    r = run(cli, ["cap", "c1", "0", "none", "--socket", daemon])
    assert r.exit_code == 0 and "no cap" in r.output, r.output
    r = run(cli, ["cap", "c1", "0", "120", "--socket", daemon])
    assert r.exit_code == 2 and "cap 120% is outside 1..100" in r.output + r.stderr
    r = run(cli, ["priority", "c1", "7", "low", "--socket", daemon])
    assert r.exit_code != 0 and "gpu 7 is not on this host" in r.stderr, r.stderr
    st = json.loads(run(cli, ["status", "--socket", daemon, "--json"]).output)
    assert st["guests"][0]["weight"] == 40 and st["gpus"][0]["policy"] == "fixed"
    r = run(cli, ["weight", "c9", "0", "10", "--socket", daemon])
    assert r.exit_code == 3 and "guest c9 holds no slice on gpu 0" in r.stderr, r.stderr
    r = run(cli, ["weight", "c1", "7", "10", "--socket", daemon])
    assert r.exit_code == 3 and "gpu 7 is not on this host" in r.stderr, r.stderr
    assert run(cli, ["weight", "c1", "0", "101", "--socket", daemon]).exit_code == 2  # usage: 1..100
    assert run(cli, ["policy", "0", "fastest", "--socket", daemon]).exit_code == 2
    r = run(cli, ["admit", "c2", "gpu=0,mem=31G", "--socket", daemon])
    assert r.exit_code == 8 and "vmgpu: error:" in r.stderr and "[REFUSED]" in r.stderr
    r = run(cli, ["release", "c1", "--socket", daemon])
    assert r.exit_code == 0 and "released c1" in r.output


def test_no_daemon_is_one_clear_error(tmp_path):
    with pytest.raises(DaemonUnavailable, match="is not answering"):
        Client(str(tmp_path / "none.sock"), timeout=1).status()


def test_kill_9_during_admit_and_release_loses_or_doubles_nothing(host):
    """A client admits and releases two-GPU guests while vmgpud is killed with SIGKILL and
    restarted, over and over; the ledger must only ever hold whole guests, within capacity."""
    sock, db, inv = host
    rng = random.Random(7)
    daemon = start_daemon(sock, db, inv)
    acked = set()
    calls = 0
    try:
        for round_ in range(6):
            c = Client(str(sock), timeout=2)
            deadline = time.monotonic() + rng.uniform(0.2, 0.6)
            i = 0
            while time.monotonic() < deadline:
                name = f"g{round_}-{i}"
                i += 1
                calls += 1
                try:
                    if acked and rng.random() < 0.3:
                        victim = rng.choice(sorted(acked))
                        c.release(victim)
                        acked.discard(victim)
                    else:
                        c.admit(name, "vm", "gpu=0,mem=700M,compute=1;gpu=1,mem=900M,compute=2")
                        acked.add(name)
                except Refused:
                    pass
            os.kill(daemon.pid, 9)  # the client may be between any two of its calls
            daemon.wait()
            c.close()
            daemon = start_daemon(sock, db, inv)
    finally:
        daemon.kill()
        daemon.wait()
    assert calls > 50 and acked  # the daemon was really busy when it was killed
    con = sqlite3.connect(db)
    guests = {r[0] for r in con.execute("SELECT name FROM guests")}
    per_guest = dict(con.execute("SELECT guest, COUNT(*) FROM slices GROUP BY guest").fetchall())
    assert all(per_guest.get(g) == 2 for g in guests)  # whole guests only
    assert set(per_guest) <= guests
    assert acked <= guests  # every acknowledged admission survived
    used = dict(con.execute("SELECT gpu, SUM(mem_mib) FROM slices GROUP BY gpu").fetchall())
    assert all(v <= 32768 for v in used.values())
    assert con.execute("SELECT COUNT(*) FROM slices WHERE gpu LIKE 'GPU-00000000%'").fetchone()[0] == len(guests)


def test_metrics_endpoint(host):
    import urllib.request

    sock, db, inv = host
    server, ledger = serve(sock, db, inv, metrics_port=0)
    try:
        c = Client(str(sock))
        c.admit("m1", "vm", "gpu=0,mem=4G,weight=30,guarantee=30%")
        with pytest.raises(Refused):
            c.admit("m2", "vm", "gpu=0,mem=30G")
        port = server.metrics_http.server_port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        stop_server(server, ledger)
    uuid0 = "GPU-00000000-0000-0000-0000-000000000000"
    assert f'vmgpu_gpu_memory_mib{{gpu="0",state="reserved",uuid="{uuid0}"}} 4096.0' in text
    assert f'vmgpu_gpu_compute_reserved_percent{{gpu="0",uuid="{uuid0}"}} 30.0' in text
    assert 'vmgpu_guest_memory_quota_mib{gpu="0",guest="m1"} 4096.0' in text
    assert 'vmgpu_admissions_total{result="admitted"} 1.0' in text
    assert 'vmgpu_admissions_total{result="refused"} 1.0' in text


def test_doctor_reports_and_fails_on_a_failed_check(daemon, tmp_path):
    from vmgpu.forwarder import gpu_present

    run = CliRunner(mix_stderr=False).invoke
    r = run(cli, ["doctor", "--socket", daemon, "--json"])
    checks = {c["name"]: c for c in json.loads(r.output)}
    assert checks["vmgpud"]["status"] == "ok" and checks["vmgpud socket"]["status"] == "ok"
    assert checks["/dev/shm"]["status"] in ("ok", "warn")
    if not gpu_present():
        assert checks["NVIDIA driver"]["status"] == "fail" and checks["NVIDIA driver"]["fix"]
        assert r.exit_code == 1
    gone = run(cli, ["doctor", "--socket", str(tmp_path / "none.sock"), "--json"])
    down = {c["name"]: c for c in json.loads(gone.output)}["vmgpud"]
    assert down["status"] == "warn" and down["fix"] == "start it: vmgpu daemon"


# ---- the control plane as an unlucky operator runs it --------------------------------------


def _vmgpud(sock, db, inv) -> subprocess.Popen:
    """`vmgpu daemon` as a process whose stderr the test reads."""
    cmd = [sys.executable, "-m", "vmgpu.cli.main", "daemon", "--socket", str(sock), "--db", str(db)]
    return subprocess.Popen([*cmd, "--inventory", str(inv), "--metrics-port", "-1"], stderr=subprocess.PIPE, text=True)


def _ended(p: subprocess.Popen, timeout: float = 20) -> tuple[int, str]:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"vmgpud {p.pid} did not stop by itself within {timeout} s") from None
    return p.returncode, p.stderr.read()


def test_a_second_vmgpud_on_the_same_socket_is_refused_and_the_first_keeps_serving(host):
    sock, db, inv = host
    first = start_daemon(sock, db, inv)
    try:
        Client(str(sock)).admit("before", "vm", "gpu=0,mem=1G")
        rc, err = _ended(_vmgpud(sock, tmp_db := db.with_name("other.db"), inv))
        assert rc == 15, err
        assert err.strip().splitlines() == [
            f"vmgpu: error: another vmgpud (pid {first.pid}) is serving {sock}: stop it first, "
            "or give this one another --socket [DAEMON_RUNNING]"
        ], err
        assert not tmp_db.exists()  # it touched nothing
        c = Client(str(sock), timeout=2, retry_s=1)
        assert [s.guest for s in c.status().slices] == ["before"]  # the first still answers
    finally:
        first.terminate()
        first.wait()
    # the first stopped cleanly: its socket is gone, and the next vmgpud starts
    assert not sock.exists()
    again = _vmgpud(sock, db, inv)
    try:
        assert wait_for(lambda: sock.exists() or again.poll() is not None)
        assert [s.guest for s in Client(str(sock)).status().slices] == ["before"]
    finally:
        again.terminate()
        _ended(again)


def test_vmgpud_never_unlinks_a_socket_or_file_it_did_not_create(host):
    import socket

    sock, db, inv = host
    sock.parent.mkdir(mode=0o700)
    sock.write_text("an operator's file")
    rc, err = _ended(_vmgpud(sock, db, inv))
    assert rc != 0 and f"{sock} exists and is not a socket" in err and "Traceback" not in err, err
    assert sock.read_text() == "an operator's file"
    sock.unlink()

    d = start_daemon(sock, db, inv)
    other = socket.socket(socket.AF_UNIX)
    try:
        # someone moves vmgpud's socket name to another socket while it runs
        sock.unlink()
        other.bind(str(sock))
        d.terminate()
        assert d.wait(timeout=20) == 0
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)  # vmgpud left the other one alone
    finally:
        other.close()
        if d.poll() is None:
            d.kill()
            d.wait()


def test_a_link_at_the_lock_file_is_refused(host, tmp_path):
    sock, db, inv = host
    sock.parent.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep")
    os.symlink(target, sock.with_name(sock.name + ".lock"))
    rc, err = _ended(_vmgpud(sock, db, inv))
    assert rc != 0 and "lock file" in err and "Traceback" not in err, err
    assert target.read_text() == "keep"


def test_a_corrupt_ledger_is_one_clear_error_naming_the_file(host):
    sock, db, inv = host
    db.parent.mkdir(mode=0o700)
    db.write_bytes(random.Random(1).randbytes(16384))
    rc, err = _ended(_vmgpud(sock, db, inv))
    lines = err.strip().splitlines()
    assert rc == 14 and len(lines) == 1, err
    assert lines[0].startswith(f"vmgpu: error: ledger {db} is not an SQLite database") and "[LEDGER]" in lines[0]
    assert "move it aside" in lines[0]
    assert not sock.exists()


def test_a_ledger_that_cannot_be_written_is_one_clear_error(host):
    """Read-only: as root a read-only mount (root ignores file modes), else file modes."""
    sock, db, inv = host
    d = start_daemon(sock, db, inv)
    Client(str(sock)).admit("kept", "vm", "gpu=0,mem=1G")
    d.terminate()
    d.wait()
    with _read_only(db.parent):
        rc, err = _ended(_vmgpud(sock, db, inv))
        lines = err.strip().splitlines()
        assert rc == 14 and len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"vmgpu: error: ledger {db} ") and "[LEDGER]" in lines[0], err
        assert "writable" in lines[0] or "read-only" in lines[0], err
    d = start_daemon(sock, db, inv)  # writable again: nothing was lost
    try:
        assert [s.guest for s in Client(str(sock)).status().slices] == ["kept"]
    finally:
        d.terminate()
        d.wait()


@contextlib.contextmanager
def _read_only(directory):
    if os.geteuid() != 0:
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in [directory, *directory.iterdir()]}
        for p in modes:
            p.chmod(0o500 if p.is_dir() else 0o400)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)
        return
    if subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True).returncode:
        pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN): root ignores file modes")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_full_disk_refuses_the_admission_cleanly_and_loses_no_acknowledged_one(host, tmp_path):
    """The ledger on a small tmpfs that fills up while vmgpud admits guests."""
    sock, _, inv = host
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a size-limited tmpfs (a full disk)")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(disk)]).returncode:
        pytest.skip("needs CAP_SYS_ADMIN to mount a size-limited tmpfs (a full disk)")
    db = disk / "ledger.db"
    d = None
    try:
        d = start_daemon(sock, db, inv)
        c = Client(str(sock))
        c.admit("g0", "vm", "gpu=0,mem=1G,compute=10")
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as f:  # fill the disk to the last block
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        acked, refusal = [], None
        for i in range(1, 2000):
            try:
                c.admit(f"guest-{i:04d}-" + "x" * 50, "vm", "gpu=1,mem=1M,compute=1;gpu=2,mem=1M,compute=1")
            except LedgerError as e:
                refusal = e
                break
            except Refused:
                break
            acked.append(f"guest-{i:04d}-" + "x" * 50)
        assert refusal is not None, "the disk never filled up"
        assert str(db) in refusal.message and "disk is full" in refusal.message, refusal.message
        assert d.poll() is None  # vmgpud goes on serving
        held = {s.guest for s in c.status().slices}
        assert {"g0", *acked} <= held
        filler.unlink()  # space again: admissions go on
        c.admit("after", "vm", "gpu=0,mem=1G,compute=1")
        os.kill(d.pid, 9)  # nothing acknowledged is lost, even to kill -9
        d.wait()
        d = start_daemon(sock, db, inv)
        assert {"g0", "after", *acked} <= {s.guest for s in Client(str(sock)).status().slices}
    finally:
        if d is not None:
            d.kill()
            d.wait()
        subprocess.run(["umount", "-l", str(disk)], check=True)


# ---- managed settings: an OOM script runs as root, so only one that only root can change --------


def _scripts(tmp_path):
    """An OOM-script directory as an operator makes it (0755) with `notify` (0755) in it."""
    d = tmp_path / "oom-scripts"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    (d / "notify").write_text("#!/bin/sh\ntrue\n")
    (d / "notify").chmod(0o755)
    return d


def _chown_away(path):
    os.chown(path, 65534, 65534, follow_symlinks=False)


HOSTILE_SCRIPTS = {
    "the script writable by its group": (lambda d: (d / "notify").chmod(0o775), "with mode 0775"),
    "the script writable by everyone": (lambda d: (d / "notify").chmod(0o757), "with mode 0757"),
    "the script another user's": (lambda d: _chown_away(d / "notify"), "belongs to uid 65534"),
    "the script a link to a root program": (
        lambda d: ((d / "notify").unlink(), (d / "notify").symlink_to("/bin/sh")),
        "is not a regular file",
    ),
    "the script a directory": (lambda d: ((d / "notify").unlink(), (d / "notify").mkdir()), "is not a regular file"),
    "the script not executable": (lambda d: (d / "notify").chmod(0o644), "is not executable"),
    "the directory writable by its group": (lambda d: d.chmod(0o775), "with mode 0775"),
    "the directory another user's": (lambda d: _chown_away(d), "belongs to uid 65534"),
    "a directory above writable by everyone": (lambda d: d.parent.chmod(0o777), "with mode 0777"),
    "a directory above another user's": (lambda d: _chown_away(d.parent), "belongs to uid 65534"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SCRIPTS))
def test_an_oom_script_anyone_but_root_could_change_is_refused(tmp_path, case):
    from vmgpu.errors import UnsafePath
    from vmgpu.supervisor import oom_script_path

    top = tmp_path / "etc"
    top.mkdir(mode=0o755)
    top.chmod(0o755)
    d = _scripts(top)
    assert oom_script_path(d, "notify") == d / "notify"
    change, message = HOSTILE_SCRIPTS[case]
    if "another user" in case and os.geteuid() != 0:
        pytest.skip("making a file another user's needs root")
    change(d)
    with pytest.raises(UnsafePath, match=message):
        oom_script_path(d, "notify")


def test_an_oom_script_directory_reached_through_a_link_or_missing_or_relative_is_refused(tmp_path):
    from vmgpu.errors import InvalidArgument, NotFound, UnsafePath
    from vmgpu.supervisor import oom_script_path

    d = _scripts(tmp_path)
    (tmp_path / "via-link").symlink_to(d)
    with pytest.raises(UnsafePath, match="is not a directory but a link"):
        oom_script_path(tmp_path / "via-link", "notify")
    with pytest.raises(NotFound, match="there is no OOM script other in"):
        oom_script_path(d, "other")
    with pytest.raises(NotFound, match="does not exist"):
        oom_script_path(tmp_path / "none", "notify")
    with pytest.raises(InvalidArgument, match="not an absolute path"):
        oom_script_path("oom-scripts", "notify")
    with pytest.raises(SpecError, match="never a path"):
        oom_script_path(d, "../oom-scripts/notify")
    # a sticky directory above (as /tmp is) is fine: no one else can rename what is in it
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert oom_script_path(_scripts(sticky), "notify") == sticky / "oom-scripts" / "notify"


def test_vmgpud_refuses_a_guest_naming_an_oom_script_it_could_not_run_and_reserves_nothing(host, tmp_path):
    from vmgpu.errors import NotFound, UnsafePath
    from vmgpu.supervisor import HostSettings

    sock, db, inv = host
    d = _scripts(tmp_path)
    server, ledger = serve(sock, db, inv, settings=HostSettings(str(d)))
    try:
        c = Client(str(sock))
        with pytest.raises(NotFound, match="there is no OOM script evil in"):
            c.admit("g1", "container", "gpu=0,mem=1G;oom-script=evil")
        with pytest.raises(SpecError, match="never a path"):
            c.admit("g1", "container", "gpu=0,mem=1G;oom-script=/bin/sh")
        (d / "notify").chmod(0o777)
        with pytest.raises(UnsafePath, match="mode 0777"):
            c.admit("g1", "container", "gpu=0,mem=1G;oom-script=notify")
        assert list(c.status().slices) == []
        (d / "notify").chmod(0o755)
        reply = c.admit("g1", "container", "gpu=0,mem=1G;oom-script=notify", label="web")
        assert [(s.guest, s.label, s.settings) for s in reply.slices] == [("g1", "web", "oom-script=notify")]
    finally:
        stop_server(server, ledger)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"oom_script": "../notify"}, SpecError, "never a path"),
        ({"oom_script": "missing"}, "NotFound", "there is no OOM script missing"),
        ({"peer_timeout_s": 86400}, SpecError, r"outside 1\.\.3600"),
        ({"ctx_reserve": 1 << 40}, "InvalidArgument", "ctx-reserve"),
    ],
)
def test_vmgpud_does_not_start_with_host_settings_it_cannot_apply(host, tmp_path, settings, error, message):
    from vmgpu import errors
    from vmgpu.supervisor import HostSettings

    sock, db, inv = host
    error = getattr(errors, error) if isinstance(error, str) else error
    with pytest.raises(error, match=message):
        serve(sock, db, inv, settings=HostSettings(str(_scripts(tmp_path)), **settings))
    assert not sock.exists()  # nothing left serving
    server, ledger = serve(sock, db, inv)  # and the socket's claim was let go
    stop_server(server, ledger)


def test_vmgpu_daemon_takes_its_settings_from_its_file_the_environment_and_the_command_line(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("vmgpu.daemon.run", lambda *a: seen.update(args=a))
    conf = tmp_path / "vmgpud.toml"
    conf.write_text(
        'oom-scripts-dir = "/srv/oom"\noom_script = "notify"\nctx-reserve = "600M"\npeer-timeout = 9\n'
        'mps = "/run/vmgpu/mps"\nmax-priority = "normal"\n'
    )
    run = CliRunner(mix_stderr=False).invoke
    r = run(cli, ["daemon", "--config", str(conf)])
    assert r.exit_code == 0, r.output + r.stderr
    settings = seen["args"][-1]
    assert (settings.oom_scripts_dir, settings.oom_script, settings.ctx_reserve, settings.peer_timeout_s) == (
        "/srv/oom",
        "notify",
        600 << 20,
        9,
    )
    assert (settings.mps_dir, settings.max_priority) == ("/run/vmgpu/mps", "normal")
    r = run(cli, ["daemon", "--config", str(conf), "--peer-timeout", "20"], env={"VMGPU_CTX_RESERVE": "0"})
    assert r.exit_code == 0 and (seen["args"][-1].peer_timeout_s, seen["args"][-1].ctx_reserve) == (20, 0)
    conf.write_text('oom-script = "notify"\nexec = "/bin/sh"\n')
    r = run(cli, ["daemon", "--config", str(conf)])
    assert r.exit_code == 2 and "unknown key 'exec'" in r.stderr
    r = run(cli, ["daemon", "--config", str(tmp_path / "none.toml")])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    conf.write_text("")
    for opt, value, message in (
        ("--ctx-reserve", "17G", "is outside 0..16G"),
        ("--ctx-reserve", "lots", "is not a number of bytes"),
        ("--peer-timeout", "0", "outside 1..3600"),
    ):
        r = run(cli, ["daemon", "--config", str(conf), opt, value])
        assert r.exit_code == 2 and message in r.stderr, (opt, value, r.stderr)
