"""The GPU pool on a real network on one machine: a three-member etcd cluster and two GPU hosts,
each in its own network namespace joined by veth pairs (tests/pool/conftest.py), and a guest
namespace that asks for slices.  The tests share the lab and run in this order; each gives back
what it took."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, PTX, guest_env
from tests.pool.conftest import GUEST_NS, TTL_S, VMGPU, inventory
from vmgpu import sched

pytestmark = pytest.mark.pool
HERE = Path(__file__).parent
GIB = 16384


def _gpus(lab) -> dict[str, dict]:
    return {g["uuid"]: g for g in lab.status()["gpus"]}


def _admit(lab, guest, *args, env=None):
    return lab.run(GUEST_NS, "pool", "admit", guest, "--pool", lab.url, "--json", *args, env=env)


def _release(lab, guest):
    r = lab.run(GUEST_NS, "pool", "release", guest, "--pool", lab.url)
    assert r.returncode == 0, r.stderr


def _verify(lab, guest, token, host):
    return lab.run(GUEST_NS, "pool", "verify", guest, "--pool", lab.url, "--host", host, stdin=token + "\n")


def test_two_hosts_register_their_gpus_under_leases_and_bind_net_gives_the_interfaces_address(lab):
    st = lab.status()
    hosts = {h["host"]: h for h in st["hosts"]}
    assert sorted(hosts) == ["ha", "hb"]
    assert hosts["ha"]["address"] == lab.address("ha")  # resolved from eth1 in ha's namespace
    assert hosts["hb"]["address"] == lab.address("hb")
    assert all(0 <= h["lease_left_s"] <= TTL_S and h["ttl_s"] == TTL_S for h in hosts.values())
    assert sorted(g["uuid"] for g in st["gpus"]) == [f"GPU-{h}-{i:04d}" for h in ("ha", "hb") for i in range(2)]
    assert all(g["mem_reserved_mib"] == 0 and g["compute_reserved_pct"] == 0 for g in st["gpus"])


def test_a_join_naming_an_interface_that_does_not_exist_is_one_line_naming_it(lab):
    r = lab.run("ha", "pool", "join", "--pool", lab.url, "--host", "hx", "--bind-net", "nosuch0")
    assert r.returncode == 3 and "interface nosuch0 does not exist" in r.stderr and "Traceback" not in r.stderr


def test_a_guest_asking_with_boyues_variables_gets_slices_across_hosts_all_or_nothing(lab):
    r = _admit(lab, "spread", env={"boyue_VGPU": "3", "boyue_GMEM": "10240", "boyue_RATIO": "40"})
    assert r.returncode == 0, r.stderr
    grant = json.loads(r.stdout)
    assert len(grant["slices"]) == 3 and len(grant["token"]) == 64
    assert {s["host"] for s in grant["slices"]} == {"ha", "hb"}
    assert all(s["mem_mib"] == 10240 and s["compute_pct"] == 40 for s in grant["slices"])
    assert {s["address"] for s in grant["slices"]} == {lab.address("ha"), lab.address("hb")}
    before = _gpus(lab)
    assert sorted(g["mem_reserved_mib"] for g in before.values()) == [0, 10240, 10240, 10240]
    # two slices of 10 GiB: only one GPU has that free now; nothing is reserved at all
    r = _admit(lab, "too-big", "--slices", "2", "--mem", "10G", "--compute", "10")
    assert r.returncode == 8 and "2 slice(s) of 10240 MiB" in r.stderr and "1 GPU(s) have that free" in r.stderr
    assert _gpus(lab) == before
    assert "too-big" not in {g["guest"] for g in lab.status()["guests"]}
    _release(lab, "spread")
    assert all(g["mem_reserved_mib"] == 0 and g["compute_reserved_pct"] == 0 for g in _gpus(lab).values())


def test_the_least_loaded_gpus_are_chosen(lab):
    assert _admit(lab, "first", "--slices", "1", "--mem", "8G", "--compute", "10").returncode == 0
    taken = next(u for u, g in _gpus(lab).items() if g["mem_reserved_mib"])
    r = _admit(lab, "second", "--slices", "3", "--mem", "1G", "--compute", "10")
    assert r.returncode == 0, r.stderr
    assert taken not in {s["uuid"] for s in json.loads(r.stdout)["slices"]}
    _release(lab, "first")
    _release(lab, "second")


def test_two_admissions_racing_for_the_last_memory_exactly_one_wins(lab):
    # three GPUs full; the fourth has 16 GiB, and eight guests want 10 GiB of it at once
    assert _admit(lab, "filler", "--slices", "3", "--mem", "16G", "--compute", "10").returncode == 0
    r = lab.python(GUEST_NS, HERE / "in_namespace.py", "race", lab.url, "8", "10G")
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    won = [g for g, what in results.items() if what.startswith("admitted")]
    assert len(won) == 1, results
    assert sorted(what for g, what in results.items() if g not in won) == ["REFUSED"] * 7
    assert sorted(g["mem_reserved_mib"] for g in _gpus(lab).values()) == [10240, GIB, GIB, GIB]
    _release(lab, won[0])
    _release(lab, "filler")


def test_a_transaction_on_a_gpu_read_before_another_admission_changed_it_is_not_applied(lab):
    r = lab.python(GUEST_NS, HERE / "in_namespace.py", "stale", lab.url)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["applied"] is False
    assert out["free_after"] == out["free_before"] - 1024  # the other admission's, not overwritten


def test_records_that_no_vmgpu_wrote_are_left_out_and_never_trusted(lab):
    assert lab.python(GUEST_NS, HERE / "in_namespace.py", "junk", lab.url, "put").returncode == 0
    try:
        st = lab.status()  # answers, without them
        assert "GPU-junk-1" not in {g["uuid"] for g in st["gpus"]} and "junk" not in {g["guest"] for g in st["guests"]}
        # a GPU that claims 1 PiB free is not chosen for 20 GiB: no real GPU has that
        r = _admit(lab, "greedy", "--slices", "1", "--mem", "20G")
        error = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 8 and "GPU-junk" not in error and "the most free is GPU-" in error
        assert r.stderr.count("pool record left out") == 2  # each said, once
        r = _verify(lab, "junk", "0" * 64, "ha")
        assert r.returncode == 1 and "not well formed" in r.stderr
    finally:
        assert lab.python(GUEST_NS, HERE / "in_namespace.py", "junk", lab.url, "delete").returncode == 0


def test_a_wrong_token_is_refused_by_the_data_planes_check(lab):
    r = _admit(lab, "tok", "--slices", "1", "--mem", "1G", "--compute", "5")
    assert r.returncode == 0, r.stderr
    grant = json.loads(r.stdout)
    token, host = grant["token"], grant["slices"][0]["host"]
    other = "hb" if host == "ha" else "ha"
    ok = _verify(lab, "tok", token, host)
    assert ok.returncode == 0 and grant["slices"][0]["uuid"] in ok.stdout
    flipped = token[:-1] + ("0" if token[-1] != "0" else "1")
    for guest, tried, on, why in (
        ("tok", flipped, host, "wrong token"),
        ("tok", token, other, f"holds no slice on host {other}"),
        ("nobody", token, host, "not admitted"),
        ("tok", "x" * 64, host, "not 64 hex digits"),
        ("tok", "", host, "not 64 hex digits"),
    ):
        r = _verify(lab, guest, tried, on)
        assert r.returncode == 1 and why in r.stderr, (guest, on, r.stderr)
    # a second admission under the same name is refused: the token is not re-issued
    again = _admit(lab, "tok", "--slices", "1", "--mem", "1G")
    assert again.returncode == 9 and "already holds slices" in again.stderr
    _release(lab, "tok")
    assert _verify(lab, "tok", token, host).returncode == 1


def _rejoin_hb(lab, ttl_s: int) -> None:
    """hb's agent replaced by one whose lease lives ttl_s (hb out of the pool in between)."""
    lab.kill("agent-hb")
    assert lab.run(GUEST_NS, "pool", "leave", "hb", "--pool", lab.url).returncode == 0
    lab.join("hb", "--address", lab.address("hb"), "--ttl", str(ttl_s))
    lab.wait_for("hb back", lambda: {h["host"]: h["ttl_s"] for h in lab.status()["hosts"]}.get("hb") == ttl_s)


def _logged(log: Path, event: str, **fields) -> bool:
    """Whether an agent's JSON log has a line of this event with these fields."""
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event and all(rec.get(k) == v for k, v in fields.items()):
            return True
    return False


def _unexpected(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.rstrip().endswith(("UNEXPECTED", "WRONG"))]


def _member(page: Path, guest: str) -> sched.Member | None:
    with sched.Page(page) as p:
        return next((m for m in p.members() if m.guest == guest), None)


def test_a_guest_on_a_machine_without_a_gpu_runs_a_program_on_a_pool_hosts_gpu(lab):
    r = _admit(lab, "far", "--slices", "1", "--mem", "2G", "--compute", "10")
    assert r.returncode == 0, r.stderr
    grant = json.loads(r.stdout)
    host = grant["slices"][0]["host"]
    assert len(grant["slices"][0]["fingerprint"]) == 64  # the host's data plane, pinned by the guest
    token = lab.tmp / "far.token"
    token.write_text(grant["token"] + "\n")
    token.chmod(0o600)
    region = Path("/dev/shm") / f"{lab.tag}-far"
    try:
        # the host serves the guest from its next renewal on: a forwarder of its own on its GPU
        agent_log = lab.tmp / f"agent-{host}.log"
        lab.wait_for("far served", lambda: _logged(agent_log, "pool guest served", guest="far"))
        # its forwarder takes part in its GPU's compute scheduling, beside any other guest there: the
        # page named by the GPU's UUID, with the 10% the pool reserved as its guarantee
        page = sched.page_path(grant["slices"][0]["uuid"], lab.sched)
        lab.wait_for("far on its GPU's page", lambda: page.exists() and _member(page, "far") is not None)
        m = _member(page, "far")
        assert (m.guarantee, m.weight) == (10, 10), m
        # the guest's machine (its own namespace, no GPU) makes the region its processes map
        lab.spawn(
            "attach-far",
            GUEST_NS,
            [*VMGPU, "pool", "attach", "far", "--pool", lab.url, "--token-file", str(token), "--region", str(region)],
        )
        lab.wait_for("far attached", lambda: "the GPU is at" in (lab.tmp / "attach-far.log").read_text())
        run = subprocess.run(
            [str(NATIVE / "drv_api"), str(PTX), "64"],
            preexec_fn=lab._enter(GUEST_NS),
            env=guest_env(region),
            capture_output=True,
            text=True,
            timeout=120,
        )
        # all but a device address for pinned memory (the host cannot see the guest's memory)
        assert [ln.split()[0] for ln in _unexpected(run.stdout)] == ["cuMemHostGetDevicePointer"], (
            run.stdout + run.stderr + (lab.tmp / "attach-far.log").read_text()
        )
        assert "large round trip" in run.stdout
        # the forwarder that served it is the host's, on the simulated backend, with the slice's quota
        plane_log = (lab.tmp / f"plane-{host}" / "netbridge.log").read_text()
        assert "guest far served as channel" in plane_log
        # a peer on the network with the guest's name and another token gets nothing
        wrong = lab.tmp / "far.wrong"
        wrong.write_text("0" * 64 + "\n")
        wrong.chmod(0o600)
        r = lab.run(
            GUEST_NS,
            "pool",
            "attach",
            "far",
            "--pool",
            lab.url,
            "--token-file",
            str(wrong),
            "--region",
            str(region) + "-x",
        )
        assert r.returncode == 2 and "refused: this token is not the guest's" in r.stderr, r.stderr
        assert not Path(str(region) + "-x").exists()
    finally:
        if "attach-far" in lab.procs:
            lab.stop("attach-far")
        _release(lab, "far")
    assert not region.exists()
    # released: the host stops its forwarder and removes its region
    lab.wait_for(
        "far no longer served",
        lambda: _logged(agent_log, "pool guest no longer served", guest="far"),
    )
    assert not Path(f"/dev/shm/vmgpu-pool-{host}-far").exists()


def test_a_restarted_host_agent_keeps_its_lease_and_the_slices_on_its_gpus(lab):
    # The new agent must come up while the killed one's lease still lives.  With the lab's 2 s
    # TTL that is a race a loaded CI machine loses (the agent starts Python and reaches etcd
    # in more than the ~1.3 s left); hb runs here with an 8 s lease, so the margin is >5 s.
    ttl_s = 8
    _rejoin_hb(lab, ttl_s)
    try:
        r = _admit(lab, "kept", "--slices", "4", "--mem", "2G", "--compute", "10")
        assert r.returncode == 0, r.stderr
        lease = {h["host"]: h["lease"] for h in lab.status()["hosts"]}["hb"]
        log = lab.tmp / "agent-hb.log"
        before = log.read_text().count('"adopted": true')
        lab.kill("agent-hb")
        lab.join("hb", "--address", lab.address("hb"), "--ttl", str(ttl_s))
        lab.wait_for("hb's new agent took its lease", lambda: log.read_text().count('"adopted": true') > before)
        time.sleep(ttl_s + 1)  # past the TTL of the lease the killed agent last renewed
        st = lab.status()
        assert {h["host"]: h["lease"] for h in st["hosts"]}["hb"] == lease
        assert [s["state"] for g in st["guests"] if g["guest"] == "kept" for s in g["slices"]] == ["held"] * 4
    finally:
        lab.run(GUEST_NS, "pool", "release", "kept", "--pool", lab.url)
        _rejoin_hb(lab, TTL_S)


def test_killing_a_host_agent_expires_its_gpus_and_the_slices_on_them_after_the_ttl(lab):
    r = _admit(lab, "doomed", "--slices", "4", "--mem", "4G", "--compute", "20")
    assert r.returncode == 0, r.stderr
    token = json.loads(r.stdout)["token"]
    lab.kill("agent-hb")
    lab.wait_for("hb expired", lambda: [h["host"] for h in lab.status()["hosts"]] == ["ha"], timeout_s=5 * TTL_S + 10)
    st = lab.status()
    assert sorted(g["host"] for g in st["gpus"]) == ["ha", "ha"]
    states = sorted(s["state"] for g in st["guests"] if g["guest"] == "doomed" for s in g["slices"])
    assert states == ["held", "held", "lost (its host left the pool)", "lost (its host left the pool)"]
    assert _verify(lab, "doomed", token, "hb").returncode == 1
    assert _verify(lab, "doomed", token, "ha").returncode == 0
    _release(lab, "doomed")
    assert all(g["mem_reserved_mib"] == 0 for g in _gpus(lab).values())
    # hb joins again, its GPUs all free
    lab.join("hb", "--address", lab.address("hb"))
    lab.wait_for("hb back", lambda: len(lab.status()["gpus"]) == 4)
    assert all(g["mem_reserved_mib"] == 0 for g in _gpus(lab).values())


def test_doctor_checks_the_route_and_mtu_to_each_pool_host(lab):
    from pyroute2 import NetNS

    # the guest's route to hb has an MTU of 1400; host hc's address has no route from the guest
    with NetNS(lab.ns(GUEST_NS)) as ns:
        idx = ns.link_lookup(ifname="eth1")[0]
        ns.route("add", dst=f"{lab.address('hb')}/32", oif=idx, metrics={"mtu": 1400})
    hc = inventory(lab.tmp / "hc.toml", "hc", 1, "8G")
    lab.spawn(
        "agent-hc",
        "ha",
        [
            *VMGPU,
            "pool",
            "join",
            "--pool",
            lab.url,
            "--host",
            "hc",
            "--address",
            "10.99.0.1",
            "--inventory",
            str(hc),
            "--ttl",
            str(TTL_S),
        ],
    )
    lab.wait_for("hc joined", lambda: "hc" in {h["host"] for h in lab.status()["hosts"]})
    r = lab.run(GUEST_NS, "doctor", "--pool", lab.url, "--json", "--socket", str(lab.tmp / "no-vmgpud.sock"))
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 1  # a failed check
    assert checks["pool etcd"]["status"] == "ok" and "3 of 3" in checks["pool etcd"]["detail"]
    assert checks["route to ha"]["status"] == "ok" and "via eth1" in checks["route to ha"]["detail"]
    assert "MTU 1500" in checks["route to ha"]["detail"]
    assert checks["route to hb"]["status"] == "warn" and "MTU 1400" in checks["route to hb"]["detail"]
    assert checks["route to hc"]["status"] == "fail" and "10.99.0.1" in checks["route to hc"]["detail"]
    lab.kill("agent-hc")
    assert lab.run(GUEST_NS, "pool", "leave", "hc", "--pool", lab.url).returncode == 0
    assert "hc" not in {h["host"] for h in lab.status()["hosts"]}


def test_an_etcd_member_dying_does_not_stop_admission(lab):
    lab.kill("e1")  # the first member the guest and the hosts would ask
    r = _admit(lab, "survivor", "--slices", "2", "--mem", "1G", "--compute", "5")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["slices"]) == 2
    r = lab.run(GUEST_NS, "doctor", "--pool", lab.url, "--json", "--socket", str(lab.tmp / "no-vmgpud.sock"))
    pool = next(c for c in json.loads(r.stdout) if c["name"] == "pool etcd")
    assert pool["status"] == "warn" and "2 of 3" in pool["detail"] and lab.address("e1") in pool["detail"]
    # the hosts keep their leases through the survivors: past a TTL both are still there
    lab.wait_for("a renewal through e2/e3", lambda: all(h["lease_left_s"] > 0 for h in lab.status()["hosts"]))
    assert sorted(h["host"] for h in lab.status()["hosts"]) == ["ha", "hb"]
    _release(lab, "survivor")


def test_the_pool_speaks_tls_and_a_client_without_its_certificate_gets_nothing(lab):
    """The members ask every client for a certificate signed by the pool's CA (etcds://,
    VMGPU_POOL_CA/CERT/KEY); a client without one, one that speaks plain HTTP to them, one that
    trusts another CA, and one whose key others can read get nothing."""
    assert lab.run(GUEST_NS, "pool", "status", "--pool", lab.url).returncode == 0
    no_cert = lab.run(GUEST_NS, "pool", "status", "--pool", lab.url, env={"VMGPU_POOL_CERT": "", "VMGPU_POOL_KEY": ""})
    assert no_cert.returncode == 14 and "no etcd member answers" in no_cert.stderr, no_cert.stderr
    plain = lab.run(GUEST_NS, "pool", "status", "--pool", lab.url.replace("etcds://", "etcd://"))
    assert plain.returncode == 14, plain.stderr
    other_ca = lab.run(
        GUEST_NS, "pool", "status", "--pool", lab.url, env={"VMGPU_POOL_CA": str(lab.tls / "client.pem")}
    )
    assert other_ca.returncode == 14 and "CERTIFICATE_VERIFY_FAILED" in other_ca.stderr, other_ca.stderr
    open_key = lab.tmp / "open.key"
    open_key.write_bytes((lab.tls / "client.key").read_bytes())
    open_key.chmod(0o644)
    r = lab.run(GUEST_NS, "pool", "status", "--pool", lab.url, env={"VMGPU_POOL_KEY": str(open_key)})
    assert r.returncode != 0 and "only it can read" in r.stderr and "Traceback" not in r.stderr, r.stderr
