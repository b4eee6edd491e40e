"""`vmgpu vm` against libvirt's test driver (no daemon): the persistent definition gains the
share and the region device, keeps everything else, and loses them again on detach."""

import pytest

from vmgpu import spec
from vmgpu.errors import InvalidArgument, NotFound
from vmgpu.virt import domain
from vmgpu.virt.libvirt_domains import Domains

# the libvirt extra; where libvirt-dev is missing `make venv` leaves it out (CI insists: LIBVIRT=yes)
pytest.importorskip("libvirt", reason="libvirt-python is not installed (the libvirt extra: make venv LIBVIRT=yes)")

XML = """<domain type='test'><name>web1</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>
<description>keep me</description><os><type>hvm</type></os>
<devices><disk type='file' device='disk'><source file='/var/lib/web1.img'/><target dev='vda'/></disk></devices>
</domain>"""


@pytest.fixture
def doms():
    d = Domains("test:///default")  # the test driver's state lives as long as this connection
    d.conn.defineXML(XML)
    yield d
    d.close()


def test_attach_show_detach(doms):
    out = doms.attach("web1", spec.parse("gpu=0,mem=8G,compute=50;gpu=1,mem=25%,compute=10"), heap_mib=16)
    assert out["share"] == "gpu=0,mem=8192M,weight=50;gpu=1,mem=25%,weight=10"
    assert [(s["gpu"], s["mem"], s["weight"]) for s in out["slices"]] == [("0", "8192 MiB", "50"), ("1", "25%", "10")]
    assert out["region"] == {"name": "vmgpu-web1", "model": "ivshmem-plain", "size_mib": domain.region_size_mib(16)}
    assert out["problem"] is None and out["running"] is False
    xml = doms.conn.lookupByName("web1").XMLDesc(0)
    assert "keep me" in xml and "/var/lib/web1.img" in xml
    assert doms.show("web1")["share"] == out["share"]
    assert doms.detach("web1") is True
    after = doms.show("web1")
    assert after["share"] is None and after["region"] is None and after["problem"] is None
    assert "/var/lib/web1.img" in doms.conn.lookupByName("web1").XMLDesc(0)
    assert doms.detach("web1") is False


def test_show_reports_a_hand_broken_definition(doms):
    doms.attach("web1", spec.parse("gpu=0,mem=1G"))
    xml = doms.conn.lookupByName("web1").XMLDesc(0).replace("<size unit='M'>512</size>", "<size unit='M'>300</size>")
    doms.conn.defineXML(xml)
    assert "must be a power of two" in doms.show("web1")["problem"]


def test_unknown_domain_and_bad_heap(doms):
    with pytest.raises(NotFound, match="no domain 'nope'"):
        doms.show("nope")
    with pytest.raises(InvalidArgument, match="--heap"):
        doms.attach("web1", spec.parse("gpu=0,mem=1G"), heap_mib=1)


def _vm(*args):
    """`vmgpu vm ARGS` against the test driver's own domain `test` (a fresh state each connection)."""
    import json

    from click.testing import CliRunner

    from vmgpu.cli.main import cli

    r = CliRunner(mix_stderr=False).invoke(cli, ["vm", *args, "--connect", "test:///default", "--json"])
    return r, (json.loads(r.output) if r.exit_code == 0 else None)


def test_vm_attach_takes_the_share_grammars_fields_and_the_guests_own_settings():
    r, out = _vm(
        "attach", "test", "--gpu", "0", "--mem", "2G", "--weight", "30", "--guarantee", "20%", "--cap", "60",
        "--priority", "HIGH", "--oom-script", "notify", "--peer-timeout", "45s", "--heap", "16M",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    slice_text = "gpu=0,mem=2048M,weight=30,guarantee=20%,cap=60%,priority=high"
    assert out["share"] == f"{slice_text};oom-script=notify,peer-timeout=45"
    assert out["slices"] == [
        {"gpu": "0", "mem": "2048 MiB", "weight": "30", "guarantee": "20%", "cap": "60%", "priority": "high"}
    ]
    assert out["settings"] == {"oom-script": "notify", "peer-timeout": "45"}
    # the same share as `vmgpu admit` would take it, through --spec
    r2, out2 = _vm("attach", "test", "--spec", out["share"], "--heap", "16M")
    assert r2.exit_code == 0 and out2["share"] == out["share"] and out2["settings"] == out["settings"]
    # --compute is still the old name of --weight
    r3, out3 = _vm("attach", "test", "--gpu", "1", "--mem", "1G", "--compute", "40")
    assert r3.exit_code == 0 and out3["share"] == "gpu=1,mem=1024M,weight=40" and out3["settings"] == {}


def test_vm_attach_refuses_a_bad_field_or_a_mix_with_one_line_naming_it():
    r, _ = _vm("attach", "test", "--gpu", "0", "--mem", "1G", "--weight", "300")
    assert r.exit_code != 0 and "slice 1: weight 300" in r.stderr and r.stderr.count("\n") == 1
    r, _ = _vm("attach", "test", "--gpu", "0", "--mem", "1G", "--weight", "3", "--compute", "4")
    assert "--compute is the old name of --weight" in r.stderr
    r, _ = _vm("attach", "test", "--spec", "gpu=0,mem=1G", "--cap", "50%")
    assert "give either --spec or --cap, not both" in r.stderr
    r, _ = _vm("attach", "test", "--gpu", "0", "--mem", "1G", "--oom-script", "../../bin/evil")
    assert "never a path" in r.stderr
    r, _ = _vm("attach", "test", "--mem", "1G")
    assert "give --gpu and --mem" in r.stderr


def test_vm_show_displays_the_domains_own_settings_and_says_the_rest_are_the_hosts():
    from click.testing import CliRunner

    from vmgpu.cli import render

    # one connection (the test driver forgets at its close): attach, then show through the renderer
    doms = Domains("test:///default")
    try:
        doms.attach("test", spec.parse("gpu=0,mem=1G;peer-timeout=30"), heap_mib=16)
        shown = doms.show("test")
        assert shown["settings"] == {"peer-timeout": "30"}
        with CliRunner().isolation() as (out, _err):  # the table and the lines go to click's stdout
            render.vm(shown)
        text = out.getvalue().decode()
    finally:
        doms.close()
    assert "settings: peer-timeout=30 (the rest: the host's)" in text
    assert "weight=100" in text
