"""`vmgpu hooks install/uninstall` and `vmgpu runtime install`, as an operator runs them."""

import json

from click.testing import CliRunner

from vmgpu.cli.main import cli


def test_hooks_install_and_uninstall(tmp_path):
    r = CliRunner().invoke(cli, ["hooks", "install", "--dir", str(tmp_path), "--backend", "sim", "--no-reload"])
    assert r.exit_code == 0, r.output
    script = tmp_path / "qemu.d" / "50-vmgpu"
    assert f"installed {script}" in r.output and "libvirtd not signalled" in r.output
    text = script.read_text()
    assert text.startswith("#!/") and "'backend': 'sim'" in text and "vmgpu.virt.hook" in text
    assert CliRunner().invoke(cli, ["hooks", "uninstall", "--dir", str(tmp_path)]).output == "removed the vmgpu hook\n"
    assert not script.exists()
    assert "no vmgpu hook" in CliRunner().invoke(cli, ["hooks", "uninstall", "--dir", str(tmp_path)]).output


def test_runtime_install_registers_with_docker_and_keeps_the_rest(tmp_path):
    dj = tmp_path / "daemon.json"
    dj.write_text(json.dumps({"log-level": "warn", "runtimes": {"other": {"path": "/x"}}}))
    rt = tmp_path / "bin" / "vmgpu-container-runtime"
    args = ["runtime", "install", "--path", str(rt), "--daemon-json", str(dj), "--backend", "sim"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    conf = json.loads(dj.read_text())
    assert conf["log-level"] == "warn" and conf["runtimes"] == {"other": {"path": "/x"}, "vmgpu": {"path": str(rt)}}
    assert "'backend': 'sim'" in rt.read_text() and rt.stat().st_mode & 0o111


def test_runtime_install_refuses_a_broken_daemon_json(tmp_path):
    dj = tmp_path / "daemon.json"
    dj.write_text("{not json")
    r = CliRunner().invoke(cli, ["runtime", "install", "--path", str(tmp_path / "rt"), "--daemon-json", str(dj)])
    assert r.exit_code == 1 and "is not valid JSON" in r.output and "[VMGPU_ERROR]" in r.output
    assert dj.read_text() == "{not json"
