"""The admission ledger: the operators' scenarios on three 32 GiB GPUs, all-or-nothing
admission, refusals that say what was asked and free, durability, and no overcommit
under concurrent admission."""

import io
import json
import multiprocessing
import sqlite3

import pytest

from vmgpu import logging as vlog
from vmgpu.errors import Conflict, InvalidArgument, NotFound, Refused
from vmgpu.gpu import Gpu
from vmgpu.ledger import Ledger
from vmgpu.spec import SpecError, parse

GPUS = [Gpu(i, f"GPU-0000000{i}-0000-0000-0000-000000000000", "test 32G", 32768) for i in range(3)]


@pytest.fixture
def ledger(tmp_path):
    lg = Ledger(tmp_path / "ledger.db")
    lg.sync_gpus(GPUS)
    yield lg
    lg.close()


def per_gpu(mem, compute=100):
    return parse(";".join(f"gpu={i},mem={m},compute={compute}" for i, m in enumerate(mem)))


def reserved(lg):
    return [(u.mem_reserved_mib, u.compute_reserved_pct) for u in lg.usage()]


def test_a_request_over_a_card_is_refused_and_nothing_stays_reserved(ledger):
    with pytest.raises(SpecError, match=r"slice 3: mem 40960 MiB is more than GPU 2 has \(32768 MiB\)"):
        ledger.admit("a", "vm", per_gpu([20480, 20480, 40960], 10))
    assert reserved(ledger) == [(0, 0)] * 3 and ledger.reservations() == []


def test_b_guests_fill_memory_and_a_fourth_is_refused(ledger):
    for name, mib in (("g1", 20480), ("g2", 10240), ("g3", 2048)):
        ledger.admit(name, "vm", per_gpu([f"{mib}M"] * 3, 10))
    assert [u.mem_free_mib for u in ledger.usage()] == [0, 0, 0]
    with pytest.raises(Refused) as e:
        ledger.admit("g4", "container", per_gpu(["1024M"] * 3, 10))
    assert "GPU 0" in e.value.message and "memory: asked 1024 MiB, free 0 MiB" in e.value.message
    assert {r.guest for r in ledger.reservations()} == {"g1", "g2", "g3"}


def test_c_a_slice_over_100_percent_compute_is_refused_at_validation(ledger):
    with pytest.raises(SpecError, match="compute 110% is outside 1..100"):
        ledger.admit("c", "vm", parse("gpu=0,mem=1G,compute=110"))
    assert ledger.reservations() == []


def guaranteed(mem, pct):
    return parse(";".join(f"gpu={i},mem={m},guarantee={pct}%" for i, m in enumerate(mem)))


def test_d_guests_fill_compute_guarantees_and_a_fourth_is_refused(ledger):
    for name, pct in (("d1", 25), ("d2", 25), ("d3", 50)):
        ledger.admit(name, "vm", guaranteed(["1024M"] * 3, pct))
    with pytest.raises(Refused, match=r"GPU 0 .*compute: asked 10%, free 0% \(guarantees; a weight reserves nothing"):
        ledger.admit("d4", "vm", guaranteed(["1024M"] * 3, 10))
    assert [u.compute_free_pct for u in ledger.usage()] == [0, 0, 0]
    # a weight, a cap or a priority reserves nothing: a weighted guest still comes in
    (r,) = ledger.admit("d5", "vm", parse("gpu=0,mem=1G,weight=100,cap=50%,priority=high"))
    assert (r.weight, r.guarantee_pct, r.cap_pct, r.priority) == (100, 0, 50, "high")


def test_weights_never_refuse_admission_two_default_guests_share_an_empty_card(ledger):
    ledger.admit("w1", "vm", parse("gpu=0,mem=1G"))
    ledger.admit("w2", "vm", parse("gpu=0,mem=1G,compute=100"))  # the old key: a weight, nothing reserved
    assert [(r.guest, r.weight, r.guarantee_pct) for r in ledger.reservations()] == [("w1", 100, 0), ("w2", 100, 0)]
    assert reserved(ledger)[0] == (2048, 0)


def test_cap_and_priority_change_live_and_are_checked(ledger):
    ledger.admit("p", "vm", parse("gpu=0,mem=1G;gpu=1,mem=1G"))
    assert ledger.set_cap("p", "1", 30) == GPUS[1].uuid and ledger.set_priority("p", "0", "low") == GPUS[0].uuid
    assert [(r.gpu_index, r.cap_pct, r.priority) for r in ledger.reservations()] == [(0, 0, "low"), (1, 30, "normal")]
    ledger.set_cap("p", "1", 0)
    assert ledger.reservations()[1].cap_pct == 0
    with pytest.raises(InvalidArgument, match="cap 101% is not in 0..100"):
        ledger.set_cap("p", "0", 101)
    with pytest.raises(InvalidArgument, match="priority 'urgent' is not one of high, normal, low"):
        ledger.set_priority("p", "0", "urgent")
    with pytest.raises(NotFound, match="guest p holds no slice on gpu 2"):
        ledger.set_priority("p", "2", "high")


def test_all_or_nothing_across_gpus(ledger):
    ledger.admit("big", "vm", parse("gpu=2,mem=30G"))
    with pytest.raises(Refused, match=r"GPU 2 .*memory: asked 4096 MiB, free 2048 MiB"):
        ledger.admit("both", "vm", parse("gpu=0,mem=4G;gpu=1,mem=4G;gpu=2,mem=4G"))
    assert [r.guest for r in ledger.reservations()] == ["big"]  # nothing of GPU 0 or 1 was kept


def test_release_frees_and_is_idempotent(ledger):
    ledger.admit("r", "vm", parse("gpu=0,mem=50%,guarantee=40%"))
    assert reserved(ledger)[0] == (16384, 40)
    assert ledger.release("r") is True
    assert ledger.release("r") is False
    assert reserved(ledger)[0] == (0, 0)


def test_readmit_same_spec_is_idempotent_other_spec_conflicts(ledger):
    a = ledger.admit("x", "vm", parse("gpu=0,mem=1G"))
    assert ledger.admit("x", "vm", parse("gpu=0,mem=1G")) == a
    with pytest.raises(Conflict, match="already admitted"):
        ledger.admit("x", "vm", parse("gpu=0,mem=2G"))


def test_unknown_gpu(ledger):
    with pytest.raises(NotFound, match=r"slice 1: gpu 7 is not on this host \(GPUs: 0, 1, 2\)"):
        ledger.admit("u", "vm", parse("gpu=7,mem=1G"))


def test_durable_and_in_wal_mode(tmp_path):
    path = tmp_path / "l.db"
    lg = Ledger(path)
    lg.sync_gpus(GPUS)
    lg.admit("keep", "vm", parse("gpu=1,mem=3G,compute=30"))
    lg.close()
    again = Ledger(path)
    assert [(r.guest, r.gpu_index, r.mem_mib, r.compute_pct) for r in again.reservations()] == [("keep", 1, 3072, 30)]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_admissions_and_refusals_are_logged_with_the_guest(tmp_path):
    buf = io.StringIO()
    vlog.configure(json=True, stream=buf)
    lg = Ledger(tmp_path / "log.db")
    lg.sync_gpus(GPUS)
    lg.admit("logged", "container", parse("gpu=0,mem=32G"))
    with pytest.raises(Refused):
        lg.admit("late", "vm", parse("gpu=0,mem=1G"))
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert {"event": "admitted", "guest": "logged", "kind": "container"}.items() <= events[0].items()
    refusal = events[1]
    assert refusal["event"] == "refused" and refusal["guest"] == "late" and refusal["resource"] == "memory"
    assert refusal["asked_mib"] == 1024 and refusal["free_mib"] == 0 and refusal["gpu"] == 0


def _admit_many(path, prefix, n, out):
    lg = Ledger(path)
    ok = 0
    for i in range(n):
        try:
            lg.admit(f"{prefix}{i}", "container", parse("gpu=0,mem=1000M,compute=1"))
            ok += 1
        except Refused:
            pass
    out.put(ok)


def test_concurrent_admission_never_overcommits(tmp_path):
    # spawn, not fork: the test process may hold gRPC and libvirt threads, and forking a
    # threaded process can crash in their fork handlers
    path = tmp_path / "race.db"
    Ledger(path).sync_gpus(GPUS)
    q = multiprocessing.get_context("spawn").Queue()
    procs = [multiprocessing.get_context("spawn").Process(target=_admit_many, args=(path, p, 20, q)) for p in "abcd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    admitted = sum(q.get() for _ in procs)
    assert admitted == 32  # 32 x 1000 MiB fit in 32768 MiB; 80 asked
    assert Ledger(path).usage()[0].mem_reserved_mib == 32000


# The schema of the first ledgers (before weights, policies, geometry, labels and settings).
OLD_SCHEMA = """
CREATE TABLE gpus (uuid TEXT PRIMARY KEY, idx INTEGER NOT NULL UNIQUE, name TEXT NOT NULL DEFAULT '',
    mem_mib INTEGER NOT NULL CHECK (mem_mib > 0), compute_pct INTEGER NOT NULL DEFAULT 100);
CREATE TABLE guests (name TEXT PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('vm', 'container', 'process')),
    spec TEXT NOT NULL, admitted_at REAL NOT NULL);
CREATE TABLE forwarders (guest TEXT PRIMARY KEY REFERENCES guests(name), pid INTEGER NOT NULL,
    region TEXT NOT NULL, backend TEXT NOT NULL, size TEXT NOT NULL, started_at REAL NOT NULL);
CREATE TABLE slices (guest TEXT NOT NULL REFERENCES guests(name) ON DELETE CASCADE,
    gpu TEXT NOT NULL REFERENCES gpus(uuid), mem_mib INTEGER NOT NULL CHECK (mem_mib > 0),
    compute_pct INTEGER NOT NULL CHECK (compute_pct BETWEEN 1 AND 100), PRIMARY KEY (guest, gpu));
"""


def test_a_ledger_of_the_first_schema_gains_labels_and_settings_and_loses_nothing(tmp_path):
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(OLD_SCHEMA)
    uuid = GPUS[0].uuid
    con.execute("INSERT INTO gpus VALUES (?, 0, 'test 32G', 32768, 100)", (uuid,))
    con.execute("INSERT INTO guests VALUES ('ctr-0123456789ab', 'container', 'gpu=0,mem=8192M,compute=50', 1.0)")
    con.execute("INSERT INTO slices VALUES ('ctr-0123456789ab', ?, 8192, 50)", (uuid,))
    con.execute("INSERT INTO forwarders VALUES ('ctr-0123456789ab', 4242, '/dev/shm/r', 'sim', '', 2.0)")
    con.commit()
    con.close()
    lg = Ledger(path)
    try:
        (r,) = lg.reservations()
        assert (r.guest, r.gpu_uuid, r.mem_mib, r.compute_pct, r.weight) == ("ctr-0123456789ab", uuid, 8192, 50, 50)
        assert (r.kind, r.label, r.settings) == ("container", "", "")
        assert lg.forwarders() == [("ctr-0123456789ab", 4242, "/dev/shm/r", "sim", "")]
        assert lg.forwarder_settings("ctr-0123456789ab") == {} and lg.forwarder_geometry("ctr-0123456789ab") is None
        # the same spec admitted again (a hook's retry) is still the same guest
        assert lg.admit("ctr-0123456789ab", "container", parse("gpu=0,mem=8G,compute=50")) == [r]
        lg.admit("ctr-ba9876543210", "container", parse("gpu=0,mem=1G,compute=10;oom-script=notify"), label="web-1")
        lg.record_forwarder("ctr-ba9876543210", 7, "/dev/shm/s", "sim", "", None, {"oom_script": "notify"})
    finally:
        lg.close()
    lg = Ledger(path)  # and it all survives the next start
    try:
        new = lg.reservations("ctr-ba9876543210")[0]
        assert (new.label, new.settings) == ("web-1", "oom-script=notify")
        assert lg.guest_settings("ctr-ba9876543210").oom_script == "notify"
        assert lg.forwarder_settings("ctr-ba9876543210") == {"oom_script": "notify"}
        assert lg.guest_settings("ctr-0123456789ab") == parse("gpu=0,mem=1").settings
    finally:
        lg.close()


def test_a_guests_settings_are_part_of_its_share_a_readmission_with_others_conflicts(ledger):
    ledger.admit("vm1", "vm", parse("gpu=0,mem=1G;peer-timeout=30"))
    assert ledger.admit("vm1", "vm", parse("gpu=0,mem=1G;peer-timeout=30s"))[0].settings == "peer-timeout=30"
    with pytest.raises(Conflict, match="already admitted with another share"):
        ledger.admit("vm1", "vm", parse("gpu=0,mem=1G;peer-timeout=31"))
    with pytest.raises(Conflict):
        ledger.admit("vm1", "vm", parse("gpu=0,mem=1G"))


# The schema before guarantees, caps and priorities: the first one with the columns added since
# (weight, policy, geometry, label, settings), where the compute % was both a weight and reserved.
RESERVED_COMPUTE_SCHEMA = (
    OLD_SCHEMA
    + """
ALTER TABLE slices ADD COLUMN weight INTEGER CHECK (weight BETWEEN 1 AND 100);
ALTER TABLE gpus ADD COLUMN policy TEXT NOT NULL DEFAULT 'weighted';
ALTER TABLE forwarders ADD COLUMN geometry TEXT NOT NULL DEFAULT '';
ALTER TABLE guests ADD COLUMN label TEXT NOT NULL DEFAULT '';
ALTER TABLE forwarders ADD COLUMN settings TEXT NOT NULL DEFAULT '';
"""
)


def test_a_ledger_that_reserved_compute_is_migrated_to_weights_that_reserve_nothing(tmp_path):
    path = tmp_path / "reserved.db"
    con = sqlite3.connect(path)
    con.executescript(RESERVED_COMPUTE_SCHEMA)
    uuid = GPUS[0].uuid
    con.execute("INSERT INTO gpus VALUES (?, 0, 'test 32G', 32768, 100, 'fixed')", (uuid,))
    con.execute("INSERT INTO guests VALUES ('a', 'vm', 'gpu=0,mem=8192M,compute=60', 1.0, '')")
    con.execute("INSERT INTO guests VALUES ('b', 'vm', 'gpu=0,mem=1024M,compute=40;peer-timeout=9', 1.0, 'bee')")
    con.execute("INSERT INTO slices VALUES ('a', ?, 8192, 60, NULL)", (uuid,))
    con.execute("INSERT INTO slices VALUES ('b', ?, 1024, 40, 75)", (uuid,))  # `vmgpu weight b 0 75`
    con.commit()
    con.close()
    lg = Ledger(path)
    try:
        got = [(r.guest, r.compute_pct, r.weight, r.guarantee_pct, r.cap_pct, r.priority) for r in lg.reservations()]
        assert got == [("a", 60, 60, 0, 0, "normal"), ("b", 40, 75, 0, 0, "normal")]
        assert reserved(lg)[0] == (9216, 0) and lg.policies()[uuid] == "fixed"
        specs = dict(lg.db.execute("SELECT name, spec FROM guests"))
        assert specs == {"a": "gpu=0,mem=8192M,weight=60", "b": "gpu=0,mem=1024M,weight=40;peer-timeout=9"}
        assert lg.reservations("b")[0].settings == "peer-timeout=9" and lg.reservations("b")[0].label == "bee"
        # a hook admitting a again with the spec of its domain (old grammar) finds the same guest
        assert [r.guest for r in lg.admit("a", "vm", parse("gpu=0,mem=8G,compute=60"))] == ["a"]
        # nothing was reserved: a new guest's guarantee of all the card fits
        assert lg.admit("c", "vm", parse("gpu=0,mem=1G,guarantee=100%"))[0].guarantee_pct == 100
    finally:
        lg.close()
    lg = Ledger(path)  # migrated once: a second start changes nothing
    try:
        assert [r.guarantee_pct for r in lg.reservations()] == [0, 0, 100]
    finally:
        lg.close()
