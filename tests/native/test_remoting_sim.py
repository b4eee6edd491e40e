"""CUDA remoting end to end on the simulated backend: unchanged programs, the guest
library's local answers, hostile guests, and what happens when either side dies."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.forwarder import (
    GUEST_LIB,
    NATIVE,
    PTX,
    ROOT,
    forwarder,
    hold,
    log_text,
    memquota,
    run_guest,
    wait_for,
    worker_pids,
)
from vmgpu import stats

pytestmark = pytest.mark.native
ASAN = ROOT / "build" / "asan"
GEN = ROOT / "native" / "cuda_api"


def test_driver_api_program_runs_through_the_forwarder(shm_path):
    with forwarder(shm_path, mem="2G") as fwd:
        r = run_guest([NATIVE / "drv_api", PTX, 24], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 unexpected" in r.stdout
    assert "vadd result" in r.stdout and "UNEXPECTED" not in r.stdout and "WRONG" not in r.stdout
    log = log_text(fwd)
    # the simulated backend says so, on every line
    assert all("SIMULATED (no GPU)" in ln for ln in log.splitlines() if ln.startswith("vmgpu-forwarder"))
    assert "closed after" in log and "its memory and objects are freed" in log
    assert "SIMULATED backend" in r.stderr


def test_unchanged_nvcc_program_runs_through_the_forwarder(shm_path):
    """Static cudart: bootstrap through cuGetProcAddress and the export tables, then real work."""
    with forwarder(shm_path):
        r = run_guest([NATIVE / "vecadd_ptx", 300000], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "vecadd ok n=300000"


def test_module_image_crosses_once(shm_path):
    """A second process loading the same fatbin gets it from the forwarder's content cache."""
    with forwarder(shm_path) as fwd:
        for _ in range(2):
            r = run_guest([NATIVE / "vecadd_ptx", 1000], shm_path)
            assert r.returncode == 0, r.stdout + r.stderr
        assert wait_for(lambda: log_text(fwd).count("closed after") == 2)
    log = log_text(fwd)
    assert "module images: 1 sent, 0 from cache" in log
    assert "module images: 0 sent, 1 from cache" in log


def test_guest_gpus_map_to_the_host_gpus_given(shm_path, monkeypatch):
    """--gpus 2,0 on a host with three GPUs: the guest sees two, in that order, each with its quota."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")
    with forwarder(shm_path, mem="1G,2G", extra=["--gpus", "2,0"]):
        r = run_guest([NATIVE / "multi"], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "devices 2"
    # the simulated UUIDs end in host ordinal + 1; PCI bus ids are 0x42 + ordinal
    assert lines[1] == f"device 0 uuid_last=3 pci=00000000:44:00.0 total={1 << 30} data=ok"
    assert lines[2] == f"device 1 uuid_last=1 pci=00000000:42:00.0 total={2 << 30} data=ok"


def test_no_region_is_no_device(tmp_path):
    r = run_guest([NATIVE / "hold", 0], tmp_path / "absent")
    assert r.stdout.strip() == "init failed"
    assert "no GPU region at" in r.stderr and "VMGPU_REGION" in r.stderr


def test_quota_is_enforced_and_reported(shm_path):
    with forwarder(shm_path, mem="64M"):
        free = run_guest([NATIVE / "hold", 0], shm_path)
        over = run_guest([NATIVE / "hold", 80], shm_path)
    assert free.stdout.split() == ["free", str(64 << 20), str(64 << 20)]
    assert over.returncode == 1 and over.stdout.strip() == "alloc failed"


def test_killed_guest_process_frees_its_memory(shm_path):
    with forwarder(shm_path, mem="1G", extra=["--peer-timeout", "1"]) as fwd:
        p = hold(shm_path, 512)
        held = p.stdout.readline().split()
        assert held == ["held", str(512 << 20), str(1 << 30)]
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert wait_for(lambda: "closed after" in log_text(fwd)), log_text(fwd)
        free = run_guest([NATIVE / "hold", 0], shm_path)
        assert free.stdout.split() == ["free", str(1 << 30), str(1 << 30)]


def test_every_allocation_path_is_held_to_the_quota(shm_path, tmp_path, monkeypatch):
    """Random sizes through cuMemAlloc, pitched, 3D arrays, stream-ordered, an own pool and
    VMM until refused, three times over: the program never holds more than its quota less
    the context's measured overhead, every path is refused at the edge, the books never pass
    the quota, and what the context took is all that is left at the end."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")  # the simulated driver's context overhead
    quota, ctx = 512 << 20, 32 << 20
    page = tmp_path / "stats"
    seen = []

    def check(what, fields, workers):
        books = stats.read(page)["memory"][0]["used"]
        seen.append((what, books))
        assert books <= quota
        if what == "FULL":
            assert int(fields["held"]) <= quota - ctx
            assert int(fields["total"]) == quota and int(fields["free"]) < (4 << 20)
            assert books > quota - (4 << 20)  # full to the edge, as the books say
        else:
            assert books == ctx  # the context's own memory, measured, charged

    with forwarder(shm_path, mem="512M", extra=["--stats", str(page)]) as fwd:
        refused = memquota(fwd, shm_path, 7, 3, NATIVE / "vadd.cubin", "aprsov", check)
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0), log_text(fwd)
    assert [w for w, _ in seen] == ["FULL", "FULL", "FULL", "EMPTY"]
    assert all(refused.get(k, 0) > 0 for k in "aprsov"), refused


def test_where_nothing_can_be_measured_each_context_is_charged_its_reserve(shm_path, monkeypatch):
    """The simulated driver measures its first GPU only: on the second, as under MIG, the books
    are estimates, and each guest process's context is charged --ctx-reserve."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    with forwarder(shm_path, mem="256M", extra=["--gpus", "1", "--ctx-reserve", "100M"]) as fwd:
        free = run_guest([NATIVE / "hold", 0], shm_path)
        fits = run_guest([NATIVE / "hold", 150], shm_path, input="")
        over = run_guest([NATIVE / "hold", 160], shm_path)
        assert "GPU 0: no per-process memory usage to be had here" in log_text(fwd)
    assert free.stdout.split() == ["free", str(156 << 20), str(256 << 20)], free.stdout + free.stderr
    assert fits.returncode == 0 and fits.stdout.split()[0] == "held", fits.stdout + fits.stderr
    assert over.returncode == 1 and over.stdout.strip() == "alloc failed"


def test_a_dead_worker_gives_its_memory_back(shm_path, tmp_path):
    """A worker killed outright (as a driver crash would) cannot free anything itself: the
    forwarder returns its charges, and the next guest process gets the whole quota."""
    page = tmp_path / "stats"
    with forwarder(shm_path, mem="1G", extra=["--stats", str(page), "--peer-timeout", "1"]) as fwd:
        p = hold(shm_path, 512)
        assert p.stdout.readline().split()[0] == "held"
        (worker,) = worker_pids(fwd)
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0), log_text(fwd)
        p.kill()
        p.wait()
        free = run_guest([NATIVE / "hold", 0], shm_path)
        assert free.stdout.split() == ["free", str(1 << 30), str(1 << 30)], free.stdout + log_text(fwd)


def test_oom_script_runs_with_the_guests_identity(shm_path, tmp_path):
    out = tmp_path / "oom.env"
    script = tmp_path / "on-oom"
    script.write_text(f"#!/bin/sh\n{{ echo ARG=$1; env | grep ^VMGPU_ | sort; }} > {out}.tmp && mv {out}.tmp {out}\n")
    script.chmod(0o755)
    with forwarder(shm_path, mem="64M", extra=["--guest", "vm-7", "--oom-script", str(script)]) as fwd:
        over = run_guest([NATIVE / "hold", 80], shm_path)
        assert over.returncode == 1 and over.stdout.strip() == "alloc failed"
        assert wait_for(out.exists), log_text(fwd)
        assert "out of memory on GPU 0: cuMemAlloc wanted 83886080 bytes" in log_text(fwd)
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["ARG"] == "vm-7" and env["VMGPU_GUEST"] == "vm-7"
    assert env["VMGPU_CALL"] == "cuMemAlloc" and env["VMGPU_REQUEST"] == str(80 << 20)
    assert env["VMGPU_QUOTA"] == str(64 << 20) and env["VMGPU_GPU"].startswith("GPU-")
    assert int(env["VMGPU_USED"]) <= 64 << 20


def test_a_missing_oom_script_is_refused_at_start(shm_path):
    r = subprocess.run(
        [str(NATIVE / "vmgpu-forwarder"), "--region", str(shm_path), "--oom-script", "/nonexistent/script"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "--oom-script: /nonexistent/script is not an executable file" in r.stderr


def test_lost_forwarder_is_one_sticky_error_not_a_hang(shm_path):
    with forwarder(shm_path) as fwd:
        p = hold(shm_path, 16)
        assert p.stdout.readline().startswith("held")
        fwd.proc.send_signal(signal.SIGKILL)
        fwd.proc.wait()
        out, err = p.communicate("one\ntwo\n", timeout=30)
    # CUDA_ERROR_DEVICE_UNAVAILABLE (46), every time after
    assert out.split("\n")[:2] == ["alloc 46", "alloc 46"]
    assert err.count("lost the host forwarder") == 1


def test_hostile_guest_cannot_crash_the_forwarder(shm_path):
    """Random and adversarial requests against the ASan/UBSan forwarder; it must stay up and correct."""
    exe = ASAN / "vmgpu-forwarder"
    if not exe.exists():
        pytest.fail("build/asan is missing: run `make native-asan`")
    env = dict(os.environ, VMGPU_SIMCUDA=str(ASAN / "libvmgpu-simcuda.so"))
    if shm_path.exists():
        shm_path.unlink()
    log = open(f"/tmp/{shm_path.name}.asan.log", "w+")
    fwd = subprocess.Popen(
        [str(exe), "--region", str(shm_path), "--create", "128M", "--backend", "sim"], stderr=log, env=env
    )
    try:
        assert wait_for(lambda: shm_path.exists() and "serving" in open(log.name).read())
        for seed in (1, 2, 3):
            r = subprocess.run(
                [str(ASAN / "tests" / "fuzz_forwarder"), str(shm_path), "60000", str(seed)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stdout + r.stderr + open(log.name).read()
            assert "forwarder healthy" in r.stdout
        # several hostile processes at once, some killed mid-way; then the same while another
        # process scribbles the header, channel table, rings, bulk control and heap map
        for extra in (["4"], ["4", "scribble"]):
            r = subprocess.run(
                [str(ASAN / "tests" / "fuzz_forwarder"), str(shm_path), "24000", "7", *extra],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stdout + r.stderr + open(log.name).read()
            assert "hostile processes (4 at once)" in r.stdout and "forwarder healthy" in r.stdout
        assert fwd.poll() is None, open(log.name).read()
    finally:
        fwd.terminate()
        fwd.wait(timeout=10)
    text = open(log.name).read()
    assert fwd.returncode == 0, text
    assert "runtime error" not in text and "AddressSanitizer" not in text


# ---- the guest library without a host: symbols, cuGetProcAddress, export tables ---------------


def _in_guest_process(code: str, **env) -> subprocess.CompletedProcess:
    """Run Python code that loads vmgpu's libcuda.so.1 as `cuda` (no forwarder needed)."""
    prog = f"import ctypes, sys\ncuda = ctypes.CDLL({str(GUEST_LIB / 'libcuda.so.1')!r})\n" + textwrap.dedent(code)
    e = dict(os.environ, VMGPU_REGION="/nonexistent", **env)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=e, timeout=60)


def test_guest_library_exports_exactly_the_driver_abi():
    sys.path.insert(0, str(GEN))
    from probe_driver import exported_functions

    want = (GEN / "driver" / "libcuda_exports.txt").read_text().split()
    assert exported_functions(str(GUEST_LIB / "libcuda.so.1")) == sorted(want)
    assert len(want) == 682


def test_unserved_function_logs_once_and_strict_mode_aborts():
    code = """
        r1 = cuda.cuGraphCreate(None, 0)
        r2 = cuda.cuGraphCreate(None, 0)
        print(r1, r2)
    """
    r = _in_guest_process(code)
    assert r.stdout.split() == ["801", "801"]  # CUDA_ERROR_NOT_SUPPORTED
    assert r.stderr.count("cuGraphCreate is not supported") == 1
    strict = _in_guest_process(code, VMGPU_STRICT="1")
    assert strict.returncode == -signal.SIGABRT
    assert "VMGPU_STRICT=1: aborting" in strict.stderr


def test_get_proc_address_answers_as_the_probed_driver():
    code = """
        def look(name, ver, flags=0):
            fn = ctypes.c_void_p(); st = ctypes.c_int(-1)
            rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), ver, ctypes.c_uint64(flags),
                                          ctypes.byref(st))
            got = [k for k in names if ctypes.cast(getattr(cuda, k), ctypes.c_void_p).value == fn.value]
            print(name, ver, flags, rc, st.value, got[0] if got else None)
        names = ["cuMemAlloc", "cuMemAlloc_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGetProcAddress",
                 "cuGetProcAddress_v2"]
        look("cuMemAlloc", 3000)
        look("cuMemAlloc", 12000)
        look("cuLaunchKernel", 12000, 2)
        look("cuLaunchKernel", 3000)
        look("cuGetProcAddress", 12000)
        look("cuNoSuchThing", 12000)
    """
    lines = _in_guest_process(code).stdout.splitlines()
    assert lines == [
        "cuMemAlloc 3000 0 0 0 cuMemAlloc",
        "cuMemAlloc 12000 0 0 0 cuMemAlloc_v2",
        "cuLaunchKernel 12000 2 0 0 cuLaunchKernel_ptsz",
        "cuLaunchKernel 3000 0 0 2 None",  # symbol found, version not sufficient
        "cuGetProcAddress 12000 0 0 0 cuGetProcAddress_v2",
        "cuNoSuchThing 12000 0 500 1 None",  # CUDA_ERROR_NOT_FOUND, symbol not found
    ]


def test_export_tables_known_served_unknown_refused():
    code = """
        def table(hexid):
            uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex(hexid))
            p = ctypes.c_void_p(1)
            rc = cuda.cuGetExportTable(ctypes.byref(p), ctypes.byref(uuid))
            return rc, p.value
        rc, p = table("6bd5fb6c5bf4e74a8987d93912fd9df9")
        print("cudart", rc, ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))[0])
        rc, p = table("d4082055bde6704b8d34ba123c66e1f2")
        check = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))(
            ctypes.cast(p, ctypes.POINTER(ctypes.c_void_p))[1])
        out = (ctypes.c_uint64 * 2)()
        print("integrity", check(13000, 1700000000, out), hex(out[0]), hex(out[1]))
        a = (ctypes.c_uint64 * 2)(); b = (ctypes.c_uint64 * 2)(); c = (ctypes.c_uint64 * 2)()
        check(12345, 1700000000, a); check(12345, 1700000000, b); check(12345, 1700000001, c)
        print("hash", list(a) == list(b), list(a) != list(c), a[0] != 0)
        print("f8cff951", *table("f8cff95121468b4eb9e2fb469e7c0dd9"))
        print("unknown", *table("00112233445566778899aabbccddeeff"))
        rc, p = table("1734dc26800d47458726c0f1e7dd8bca")
        slots = ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))
        get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))(slots[4])
        x, y = ctypes.c_void_p(1), ctypes.c_void_p(1)
        print("lt_aux", rc, slots[0], get(ctypes.byref(x), ctypes.byref(y)), x.value, y.value)
    """
    r = _in_guest_process(code)
    lines = r.stdout.splitlines()
    assert lines[0] == "cudart 0 104"  # 13 slots, size word first
    assert lines[1] == "integrity 0 0x3341181c03cb675c 0x8ed383aa1f4cd1e8"
    assert lines[2] == "hash True True True"
    assert lines[3] == "f8cff951 500 None"  # NOT_FOUND keeps cudart on its documented path
    assert lines[4] == "unknown 1 None"  # fails closed: INVALID_VALUE, no pointer
    assert "export table 00112233445566778899aabbccddeeff is not provided" in r.stderr
    # cuBLASLt's table: provided (refusing it kills the process); slot 4 declines, cuBLASLt falls back
    assert lines[5] == "lt_aux 0 136 801 None None"
    assert "1734dc26" not in r.stderr and "lt_aux" not in r.stderr  # a deliberate decline logs nothing


def test_md2_matches_rfc_1319():
    r = subprocess.run([str(NATIVE / "tests" / "t_md2")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "t_md2: ok", r.stdout


# ---- the generator ---------------------------------------------------------------------------------


def test_generated_code_is_current():
    r = subprocess.run([sys.executable, str(GEN / "gen.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "entry, message",
    [
        ('cuMemAlloc_v2 = { op = 16, class = "sync" }', "pointer parameter dptr (CUdeviceptr *) is not described"),
        ('cuInit = { class = "local" }\ncuCtxSynchronize = { op = 7, class = "sync" }', "needs an op number"),
        (
            'cuCtxSynchronize = { op = 20, class = "sync" }\ncuCtxSetLimit = { op = 20, class = "sync" }',
            "op 20 already used by cuCtxSynchronize",
        ),
        ('cuNotAFunction = { op = 20, class = "sync" }', "not exported by the probed driver"),
        ('cuEventRecord = { op = 20, class = "async", out = ["hEvent"] }', "is not a pointer"),
    ],
)
def test_generator_refuses_a_bad_spec(tmp_path, entry, message):
    spec = tmp_path / "api.toml"
    spec.write_text(f'[handles]\nCUstream = "stream"\nCUevent = "event"\n\n[fn]\n{entry}\n')
    r = subprocess.run(
        [sys.executable, str(GEN / "gen.py"), "--check", "--spec", str(spec)], capture_output=True, text=True
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_vmgpu_demo_runs_programs_and_says_it_is_simulated():
    r = subprocess.run(
        [sys.executable, "-m", "vmgpu.cli.main", "demo", "--backend", "sim", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["simulated"] is True and [p["ok"] for p in d["programs"]] == [True, True]
    assert all("SIMULATED (no GPU)" in ln for ln in d["forwarder_log"])


def test_breakdown_explains_a_run(shm_path, tmp_path):
    """The forwarder's statistics page, read by `vmgpu breakdown`: calls by class, bytes, top functions."""
    stats = tmp_path / "fwd.stats"
    with forwarder(shm_path, extra=["--stats", str(stats)]):
        r = run_guest([NATIVE / "drv_api", PTX, 8], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr
        out = subprocess.run(
            [sys.executable, "-m", "vmgpu.cli.main", "breakdown", str(stats), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    d = json.loads(out.stdout)
    assert d["processes"] == 1 and d["sync_calls"] > 20 and d["async_calls"] > 5
    assert d["htod_bytes"] >= 8 << 20 and d["dtoh_bytes"] >= 8 << 20
    assert d["ops"]["cuLaunchKernel"]["count"] == 4 and d["ops"]["cuGraphLaunch"]["count"] == 1
    assert d["ops"]["module functions"]["count"] == 1
    assert d["ops"]["hello"]["count"] == 1
    # 104 attribute queries: the guest's cache sends one per attribute, and one again after each
    # real set; of three sets, the one that repeats the cached value does not cross
    assert d["ops"]["cuFuncGetAttribute"]["count"] == 4
    assert d["ops"]["cuFuncSetAttribute"]["count"] == 2
