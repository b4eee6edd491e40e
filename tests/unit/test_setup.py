"""`vmgpu setup`: vmgpud's unit, the qemu hook, the docker runtime and `vmgpu` on PATH, run by the
installed package's Python and never a checkout's; idempotent, --dry-run, --uninstall, no write
through a link; and where an installed package's native programs are found."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from vmgpu import forwarder, shm_lib
from vmgpu.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
FILES = (
    "etc/systemd/system/vmgpud.service",
    "etc/libvirt/hooks/qemu.d/50-vmgpu",
    "usr/local/bin/vmgpu-container-runtime",
    "usr/local/bin/vmgpu",
)


def setup(*args):
    return CliRunner().invoke(cli, ["setup", *args])


def written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def installed_python(tmp: Path) -> Path:
    """A virtual environment holding a copy of the vmgpu package (as a wheel installs it), its
    dependencies reached through this environment's site-packages (no .pth of it is read, so the
    checkout's editable install is not)."""
    venv = tmp / "opt-vmgpu"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    shutil.copytree(REPO / "vmgpu", site / "vmgpu", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def test_setup_from_a_checkout_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "etc" / "libvirt").mkdir(parents=True)
    r = setup("--root", str(tmp_path), "--init", "systemd", "--runtime")
    assert r.exit_code == 2, r.output
    assert f"vmgpu runs from the checkout {REPO}" in r.output and "[INVALID_ARGUMENT]" in r.output
    assert written(tmp_path) == []


def test_setup_points_every_piece_at_the_installed_python_and_never_at_the_checkout(tmp_path):
    python = installed_python(tmp_path)
    root = tmp_path / "host"
    (root / "etc" / "libvirt").mkdir(parents=True)
    (root / "etc" / "docker").mkdir(parents=True)
    (root / "etc" / "docker" / "daemon.json").write_text(json.dumps({"runtimes": {"other": {"path": "/x"}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = [python, "-m", "vmgpu.cli.main", "setup", "--root", str(root), "--init", "systemd", "--no-start"]
    out = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for f in FILES:
        text = (root / f).read_text()
        assert str(python) in text, f
        assert str(REPO) not in text, f
        assert f"wrote      {root / f}" in out.stdout
    assert (root / FILES[0]).read_text().count(f"ExecStart={python} -m vmgpu.cli.main daemon\n") == 1
    for f in FILES[1:]:
        assert (root / f).read_text().startswith(f"#!{python}\n") and os.access(root / f, os.X_OK)
    conf = json.loads((root / "etc/docker/daemon.json").read_text())
    assert conf["runtimes"] == {"other": {"path": "/x"}, "vmgpu": {"path": "/usr/local/bin/vmgpu-container-runtime"}}
    # what libvirt, docker and a shell run: the installed package, from anywhere, the checkout not needed
    for f in FILES[1:]:
        interpreter = (root / f).read_text().splitlines()[0][2:]
        probe = "import vmgpu.oci, vmgpu.virt.hook; print(vmgpu.__file__)"
        got = subprocess.run(
            [interpreter, "-c", probe], cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
        )
        assert got.returncode == 0 and got.stdout.startswith(str(tmp_path / "opt-vmgpu")), (f, got.stdout, got.stderr)
    where = subprocess.run(
        [root / FILES[3], "--version"], cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert where.returncode == 0 and "vmgpu, version" in where.stdout, where.stderr
    # a command that starts a process (multiprocessing's spawn imports the script again)
    lib = {"PATH": "/usr/bin:/bin", "VMGPU_LIBDIR": str(REPO / "build" / "native")}
    st = subprocess.run(
        [root / FILES[3], "region", "selftest", "--exchanges", "10", "--json"],
        cwd="/",
        env=lib,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert st.returncode == 0, st.stdout + st.stderr
    # a second run changes nothing
    again = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.rstrip().endswith("nothing to change"), again.stdout
    assert "wrote" not in again.stdout
    # --uninstall removes what setup wrote, and keeps docker's other runtime
    gone = subprocess.run([*run, "--uninstall"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    assert written(root) == ["etc/docker/daemon.json"]
    assert json.loads((root / "etc/docker/daemon.json").read_text()) == {"runtimes": {"other": {"path": "/x"}}}


def test_dry_run_says_what_it_would_write_and_writes_nothing(tmp_path):
    r = setup("--root", str(tmp_path), "--allow-checkout", "--init", "systemd", "--hook", "--runtime", "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.output.count("would write") == 5 and written(tmp_path) == []


def test_without_systemd_setup_says_how_to_run_vmgpud_in_the_foreground(tmp_path):
    r = setup("--root", str(tmp_path), "--allow-checkout", "--no-hook", "--no-runtime")
    assert r.exit_code == 0, r.output
    assert "skipped    vmgpud's systemd unit  (systemd does not run here)" in r.output
    assert f"run vmgpud in the foreground, under this host's init or a supervisor: {sys.executable} -m " in r.output
    assert not (tmp_path / FILES[0]).exists()
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    r = setup("--root", str(tmp_path), "--allow-checkout", "--no-hook", "--no-runtime", "--no-start")
    assert r.exit_code == 0 and (tmp_path / FILES[0]).is_file(), r.output


def test_setup_without_libvirt_or_docker_skips_the_hook_and_the_runtime_and_says_so(tmp_path):
    r = setup("--root", str(tmp_path), "--allow-checkout", "--init", "none")
    assert r.exit_code == 0, r.output
    assert "no /etc/libvirt: libvirt is not installed" in r.output
    if not shutil.which("dockerd"):
        assert "docker is not installed" in r.output
    assert not (tmp_path / FILES[1]).exists()


def test_setup_refuses_to_write_through_a_symbolic_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "systemd").symlink_to(elsewhere)
    r = setup("--root", str(root), "--allow-checkout", "--init", "systemd", "--no-hook", "--no-runtime")
    assert r.exit_code == 13 and f"{root / 'etc' / 'systemd'} is a symbolic link" in r.output, r.output
    assert list(elsewhere.iterdir()) == []
    # a link at the file itself: neither followed nor replaced
    (root / "etc" / "systemd").unlink()
    target = tmp_path / "target"
    target.write_text("keep")
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / "usr" / "local" / "bin" / "vmgpu-container-runtime").symlink_to(target)
    r = setup("--root", str(root), "--allow-checkout", "--init", "none", "--no-hook", "--runtime")
    assert r.exit_code == 13 and "vmgpu-container-runtime is a symbolic link" in r.output, r.output
    assert target.read_text() == "keep" and (root / "usr" / "local" / "bin" / "vmgpu-container-runtime").is_symlink()


def test_uninstall_leaves_a_vmgpu_that_setup_did_not_write(tmp_path):
    mine = tmp_path / "usr" / "local" / "bin" / "vmgpu"
    mine.parent.mkdir(parents=True)
    mine.write_text("#!/bin/sh\necho someone else's\n")
    r = setup("--root", str(tmp_path), "--allow-checkout", "--init", "none", "--no-hook", "--no-runtime")
    assert "someone else's `vmgpu`, left alone" in r.output and mine.read_text().endswith("someone else's\n")
    r = setup("--root", str(tmp_path), "--uninstall")
    assert r.exit_code == 0 and "not vmgpu setup's, left alone" in r.output and mine.exists(), r.output


def test_hooks_install_from_a_checkout_says_the_hook_runs_the_checkout(tmp_path):
    r = CliRunner().invoke(cli, ["hooks", "install", "--dir", str(tmp_path), "--no-reload"])
    assert r.exit_code == 0 and f"written to run vmgpu from the checkout {REPO}:" in r.output, r.output


def test_an_installed_packages_native_programs_come_before_a_checkouts(tmp_path, monkeypatch):
    pkg = tmp_path / "site-packages" / "vmgpu"
    (pkg / "_native").mkdir(parents=True)
    for name in ("vmgpu-forwarder", "libvmgpushm.so"):
        (pkg / "_native" / name).write_text("")
    monkeypatch.delenv("VMGPU_LIBDIR", raising=False)
    monkeypatch.setattr(forwarder, "__file__", str(pkg / "forwarder.py"))
    monkeypatch.setattr(shm_lib, "__file__", str(pkg / "shm_lib.py"))
    assert forwarder.native_dir() == pkg / "_native"
    assert shm_lib._find_library() == pkg / "_native" / "libvmgpushm.so"
    # VMGPU_LIBDIR still comes first
    own = tmp_path / "own"
    own.mkdir()
    (own / "vmgpu-forwarder").write_text("")
    (own / "libvmgpushm.so").write_text("")
    monkeypatch.setenv("VMGPU_LIBDIR", str(own))
    assert forwarder.native_dir() == own and shm_lib._find_library() == own / "libvmgpushm.so"


def test_the_unit_lets_the_forwarders_outlive_a_vmgpud_stop_or_crash_and_is_hardened(tmp_path):
    """systemd's default KillMode (control-group) would kill every forwarder vmgpud started, and
    so every guest's GPU, at each `systemctl restart vmgpud` or crash: the unit kills vmgpud only."""
    from vmgpu import install

    unit = install.UNIT.format(mark=install.MARK, command="/opt/vmgpu/bin/python -m vmgpu.cli.main daemon")
    service = unit.split("[Service]\n", 1)[1].split("\n[", 1)[0]
    keys = dict(line.split("=", 1) for line in service.splitlines() if "=" in line and not line.startswith("#"))
    assert keys["KillMode"] == "process"
    assert keys["NoNewPrivileges"] == "yes" and keys["ProtectSystem"] == "full"
    assert "PrivateDevices" not in keys  # the forwarders open /dev/nvidia*
    analyze = shutil.which("systemd-analyze")
    if analyze:  # where systemd's own checker is here, it finds nothing wrong with the unit
        path = tmp_path / "vmgpud.service"
        path.write_text(unit.replace("/opt/vmgpu/bin/python", sys.executable))
        r = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True)
        assert "Unknown key" not in r.stderr and "Invalid" not in r.stderr, r.stderr


def _demo_dir(native: Path, *names: str) -> None:
    (native / "demo").mkdir(parents=True)
    for n in names:
        (native / "demo" / n).write_text("x")


def test_the_demo_finds_its_programs_in_an_installed_packages_native_demo_directory(tmp_path, monkeypatch):
    from vmgpu import demo

    monkeypatch.setattr(demo, "_CHECKOUT_PTX", tmp_path / "no-checkout" / "vadd.ptx")  # no checkout to fall back on
    native = tmp_path / "_native"
    _demo_dir(native, "drv_api", "vadd.ptx", "vecadd_ptx")
    programs, skipped = demo.demo_programs("sim", native)
    d = native / "demo"
    assert programs == [[d / "drv_api", d / "vadd.ptx", "64"], [d / "vecadd_ptx", str(1 << 22)]] and skipped == []
    # on a GPU the PTX one serves where the native vecadd is not there (its kernel is JIT-compiled)
    assert demo.demo_programs("cuda", native)[0][1][0] == d / "vecadd_ptx"


def test_the_demo_of_a_wheel_built_without_nvcc_runs_the_driver_api_program_and_says_what_it_left_out(tmp_path):
    from vmgpu import demo

    native = tmp_path / "_native"
    _demo_dir(native, "drv_api", "vadd.ptx")
    programs, skipped = demo.demo_programs("sim", native)
    assert [p[0].name for p in programs] == ["drv_api"]
    assert len(skipped) == 1 and skipped[0].startswith("vecadd_ptx: not here") and "nvcc" in skipped[0]


def test_the_demo_without_its_driver_api_program_says_how_to_get_it(tmp_path, monkeypatch):
    from vmgpu import demo
    from vmgpu.errors import InvalidArgument

    monkeypatch.setattr(demo, "_CHECKOUT_PTX", tmp_path / "no-checkout" / "vadd.ptx")
    native = tmp_path / "_native"
    _demo_dir(native, "vadd.ptx")
    with pytest.raises(InvalidArgument, match="reinstall the vmgpu wheel, or run `make native`"):
        demo.demo_programs("sim", native)
