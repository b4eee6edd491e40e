"""The dialects (vmgpu/dialects.py): each product's `docker run -e` line from the seeds and the
products' own documented examples gives the expected vmgpu share, exactly; contradictions,
malformed and out-of-range values are one line of SpecError naming the variable; the runtime's
create admits the translated share."""

from __future__ import annotations

import json
import os

import pytest

from vmgpu import dialects, oci
from vmgpu.errors import InvalidArgument, Refused, SpecError

HOST = ["0", "1", "2"]  # the host's GPUs, where NVIDIA_VISIBLE_DEVICES=all must be spelled out


def share(env: dict) -> str | None:
    return dialects.translate(env, lambda: HOST).text


def refusal(env: dict) -> str:
    with pytest.raises(SpecError) as e:
        dialects.translate(env, lambda: HOST)
    msg = e.value.message
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


# ---- each dialect's example lines ----------------------------------------------------------


def test_china_telecom_egpus_seed_line_gives_each_pgpu_its_mem_in_mib_and_its_weight():
    t = dialects.translate(
        {"EGPU": "POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:PGPU=1,MEM=8192,WEIGHT=30"}
    )
    assert t.dialect == "ct-egpu"
    assert t.text == "gpu=0,mem=3276M,weight=10;gpu=1,mem=8192M,weight=30"
    assert any("POLICY=0 is not enforced" in n for n in t.notes)
    assert not any("ONLINE" in n for n in t.notes)  # offline: the default priority, normal


def test_china_telecom_egpu_online_is_high_priority():
    t = dialects.translate({"EGPU": "ONLINE=1:PGPU=0,MEM=1024,WEIGHT=10"})
    assert t.text == "gpu=0,mem=1024M,weight=10,priority=high"
    with pytest.raises(SpecError, match="EGPU ONLINE"):
        dialects.translate({"EGPU": "ONLINE=2:PGPU=0,MEM=1024"})


def test_china_telecom_egpu_without_header_or_weight_gives_full_compute():
    assert share({"EGPU": "PGPU=2,MEM=1024"}) == "gpu=2,mem=1024M,weight=100"


def test_alibaba_cgpus_seed_line_gives_each_visible_gpu_its_own_size_in_gib():
    env = {
        "ALIYUN_COM_GPU_MEM_CONTAINER": "3,4,5,6",
        "ALIYUN_COM_GPU_MEM_DEV": "15",
        "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1,2,3",
        "ALIYUN_COM_GPU_SCHD_WEIGHT": "2",
    }
    t = dialects.translate(env)
    assert t.dialect == "aliyun-cgpu"
    assert t.text == (
        "gpu=0,mem=3072M,weight=10;gpu=1,mem=4096M,weight=10;gpu=2,mem=5120M,weight=10;gpu=3,mem=6144M,weight=10"
    )
    assert [k for k, _ in t.variables] == list(env)


def test_alibaba_cgpus_documented_example_gives_1g_of_a_4g_card_on_gpu_0():
    """cGPU's README: -e ALIYUN_COM_GPU_MEM_DEV=4 -e ALIYUN_COM_GPU_MEM_CONTAINER=1 gives 1G."""
    assert share({"ALIYUN_COM_GPU_MEM_DEV": "4", "ALIYUN_COM_GPU_MEM_CONTAINER": "1"}) == "gpu=0,mem=1024M,weight=100"


def test_alibaba_cgpu_high_prio_is_high_priority():
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_HIGH_PRIO": "1"}
    assert share(env) == "gpu=0,mem=1024M,weight=100,priority=high"
    assert share({**env, "ALIYUN_COM_GPU_HIGH_PRIO": "0"}) == "gpu=0,mem=1024M,weight=100"


def test_alibaba_cgpu_in_mib_units_and_one_size_for_every_gpu():
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "3803", "ALIYUN_COM_GPU_MEM_UNIT": "MiB", "NVIDIA_VISIBLE_DEVICES": "1,2"}
    assert share(env) == "gpu=1,mem=3803M,weight=100;gpu=2,mem=3803M,weight=100"


def test_alibaba_cgpu_is_off_without_its_memory_or_with_cgpu_disable_and_says_so():
    t = dialects.translate({"ALIYUN_COM_GPU_MEM_DEV": "15"})
    assert t.spec is None and "ignored" in t.notes[0]
    t = dialects.translate({"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "CGPU_DISABLE": "true"})
    assert t.spec is None and "CGPU_DISABLE" in t.notes[0]


def test_alibaba_egpus_documented_example_gives_whole_mib_of_the_bytes_and_util_as_a_cap():
    """PAI's eGPU example: 2G of memory (bytes) and at most 50% compute on NVIDIA_VISIBLE_DEVICES=1."""
    env = {
        "AMP_VGPU_ENABLE": "1",
        "GPU_MEM_PER_DEVICE": "2000000000",
        "GPU_UTIL_PER_DEVICE": "50",
        "NVIDIA_VISIBLE_DEVICES": "1",
        "AMP_USE_HOST_DAEMON": "1",
        "ALIYUN_COM_GPU_MEM_RESERVED": "10",
        "ALIYUN_COM_GPU_OOM_SCRIPT": "/bin/oom.sh",
    }
    t = dialects.translate(env)
    assert t.dialect == "aliyun-egpu" and t.text == "gpu=1,mem=1907M,weight=100,cap=50%"
    notes = " ".join(t.notes)
    assert "ALIYUN_COM_GPU_MEM_RESERVED=10 is not enforced" in notes
    assert "ALIYUN_COM_GPU_OOM_SCRIPT is not run" in notes


def test_alibaba_egpu_is_off_without_its_master_switch_and_says_so():
    t = dialects.translate({"GPU_MEM_PER_DEVICE": "2000000000"})
    assert t.spec is None and "AMP_VGPU_ENABLE=1" in t.notes[0]


def test_alibaba_egpu_with_nvidia_all_gives_every_host_gpu_the_size():
    env = {"AMP_VGPU_ENABLE": "1", "GPU_MEM_PER_DEVICE": str(4 << 30), "NVIDIA_VISIBLE_DEVICES": "all"}
    assert share(env) == ";".join(f"gpu={g},mem=4096M,weight=100" for g in HOST)


def test_boyue_gives_n_gpus_each_gmem_mib_and_ratio_compute():
    env = {"boyue_VGPU": "2", "boyue_GMEM": "4096", "boyue_RATIO": "30"}
    assert share(env) == "gpu=0,mem=4096M,weight=30;gpu=1,mem=4096M,weight=30"
    assert share({**env, "NVIDIA_VISIBLE_DEVICES": "2,0"}) == "gpu=2,mem=4096M,weight=30;gpu=0,mem=4096M,weight=30"


def test_nvidia_visible_devices_alone_gives_whole_gpus():
    assert share({"NVIDIA_VISIBLE_DEVICES": "0,1"}) == "gpu=0,mem=100%,weight=100;gpu=1,mem=100%,weight=100"
    uuid = "GPU-28df2127-fac9-f8fd-77de-e461c85c8ef2"
    assert share({"NVIDIA_VISIBLE_DEVICES": uuid}) == f"gpu={uuid},mem=100%,weight=100"
    assert share({"NVIDIA_VISIBLE_DEVICES": "all"}) == ";".join(f"gpu={g},mem=100%,weight=100" for g in HOST)
    for none in ("none", "void", ""):
        assert share({"NVIDIA_VISIBLE_DEVICES": none}) is None
    assert share({"PATH": "/bin"}) is None


def test_vmgpu_with_an_agreeing_dialect_and_a_cuda_images_nvidia_all_is_admitted():
    env = {
        "VMGPU": "gpu=0,mem=3276M,compute=10",  # the old key: the same weight
        "EGPU": "PGPU=0,MEM=3276,WEIGHT=10",
        "NVIDIA_VISIBLE_DEVICES": "all",
    }
    t = dialects.translate(env)
    assert t.dialect == "vmgpu+ct-egpu" and t.text == "gpu=0,mem=3276M,weight=10"


# ---- refusals ------------------------------------------------------------------------------


def test_vmgpu_and_a_disagreeing_dialect_are_refused_naming_both():
    msg = refusal({"VMGPU": "gpu=0,mem=4G", "EGPU": "PGPU=0,MEM=3276,WEIGHT=10"})
    assert "VMGPU" in msg and "EGPU" in msg and "agree" in msg


def test_two_dialects_giving_different_shares_are_refused():
    msg = refusal({"boyue_GMEM": "2048", "ALIYUN_COM_GPU_MEM_CONTAINER": "3"})
    assert "boyue_GMEM" in msg and "ALIYUN_COM_GPU_MEM_CONTAINER" in msg


def test_nvidia_naming_other_gpus_or_none_than_the_share_is_refused():
    assert "NVIDIA_VISIBLE_DEVICES=1" in refusal({"VMGPU": "gpu=0,mem=1G", "NVIDIA_VISIBLE_DEVICES": "1"})
    assert "no GPU" in refusal({"EGPU": "PGPU=0,MEM=100", "NVIDIA_VISIBLE_DEVICES": "void"})
    assert "no GPU" in refusal({"boyue_GMEM": "100", "NVIDIA_VISIBLE_DEVICES": "none"})
    assert "boyue_VGPU" in refusal({"boyue_VGPU": "2", "boyue_GMEM": "100", "NVIDIA_VISIBLE_DEVICES": "3"})


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"EGPU": "PGPU=0,MEM=lots"}, "EGPU MEM"),
        ({"EGPU": "PGPU=0,MEM=100,WEIGHT=0"}, "EGPU WEIGHT"),
        ({"EGPU": "PGPU=0,MEM=100,WEIGHT=101"}, "EGPU WEIGHT"),
        ({"EGPU": "PGPU=0,WEIGHT=10"}, "MEM is missing"),
        ({"EGPU": "PGPU=0,MEM=1,COLOUR=red"}, "COLOUR"),
        ({"EGPU": "TYPE=VM:PGPU=0,MEM=1"}, "TYPE"),
        ({"EGPU": "POLICY=0"}, "names no GPU"),
        ({"EGPU": "PGPU=0,MEM=1:PGPU=0,MEM=2"}, "already given"),
        ({"EGPU": "PGPU=x,MEM=1"}, "EGPU PGPU"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "5", "ALIYUN_COM_GPU_MEM_DEV": "4"}, "ALIYUN_COM_GPU_MEM_DEV=4"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3,,4"}, "ALIYUN_COM_GPU_MEM_CONTAINER"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "-3"}, "ALIYUN_COM_GPU_MEM_CONTAINER"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_SCHD_WEIGHT": "21"}, "ALIYUN_COM_GPU_SCHD_WEIGHT"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_MEM_UNIT": "parsecs"}, "ALIYUN_COM_GPU_MEM_UNIT"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3,4", "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1,2"}, "3 GPUs"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,0"}, "twice"),
        ({"AMP_VGPU_ENABLE": "1", "GPU_MEM_PER_DEVICE": "1000"}, "GPU_MEM_PER_DEVICE"),
        ({"AMP_VGPU_ENABLE": "1", "GPU_UTIL_PER_DEVICE": "150"}, "GPU_UTIL_PER_DEVICE"),
        ({"AMP_VGPU_ENABLE": "1", "ALIYUN_COM_GPU_MEM_RESERVED": "ten"}, "ALIYUN_COM_GPU_MEM_RESERVED"),
        ({"boyue_VGPU": "0"}, "boyue_VGPU"),
        ({"boyue_GMEM": "1.5"}, "boyue_GMEM"),
        ({"boyue_RATIO": "200"}, "boyue_RATIO"),
        ({"NVIDIA_VISIBLE_DEVICES": "0,GPU-nope"}, "NVIDIA_VISIBLE_DEVICES"),
        ({"NVIDIA_VISIBLE_DEVICES": "MIG-GPU-28df2127-fac9-f8fd-77de-e461c85c8ef2/1/0"}, "MIG"),
        ({"VMGPU": "gpu=0"}, "mem is missing"),
    ],
)
def test_a_malformed_or_out_of_range_value_is_one_line_naming_the_variable(env, names):
    assert names in refusal(env)


@pytest.mark.parametrize(
    "value",
    [
        "9" * 100_000,
        ":" * 100_000,
        "," * 100_000,
        "PGPU=0,MEM=" + "9" * 5000,
        "\x00\n\t\u202e٣²",
        "PGPU=0,MEM=1" + ":PGPU=1,MEM=1" * 5000,
        "=" * 1000,
    ],
)
def test_hostile_values_of_any_length_or_characters_give_one_clear_line(value):
    for name in (
        "VMGPU",
        "EGPU",
        "ALIYUN_COM_GPU_MEM_CONTAINER",
        "GPU_MEM_PER_DEVICE",
        "boyue_VGPU",
        "NVIDIA_VISIBLE_DEVICES",
    ):
        env = {name: value, "AMP_VGPU_ENABLE": "1"} if name == "GPU_MEM_PER_DEVICE" else {name: value}
        with pytest.raises(SpecError) as e:
            dialects.translate(env, lambda: HOST)
        assert "\n" not in e.value.message and len(e.value.message) < 400, e.value.message[:500]


def test_a_variable_set_twice_or_an_environment_that_is_not_text_is_refused():
    with pytest.raises(SpecError, match="EGPU is set twice"):
        dialects.environment({"process": {"env": ["EGPU=PGPU=0,MEM=1", "EGPU=PGPU=1,MEM=1"]}})
    with pytest.raises(InvalidArgument, match="not text"):
        dialects.environment({"process": {"env": ["PATH=/bin", 7]}})
    assert dialects.environment({"process": {"env": ["PATH=/bin", "boyue_GMEM=1"]}}) == {"boyue_GMEM": "1"}


# ---- the runtime -----------------------------------------------------------------------------


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, event, **kw):
        self.lines.append(("info", event, kw))

    def warning(self, event, **kw):
        self.lines.append(("warning", event, kw))


def _config(*env: str) -> dict:
    return {"process": {"env": ["PATH=/bin", *env], "user": {"uid": 0, "gid": 0}}, "mounts": [], "linux": {}}


def test_share_of_translates_a_dialect_and_logs_one_line_with_dialect_variables_and_spec():
    log = _Log()
    spec = oci.share_of(
        _config("AMP_VGPU_ENABLE=1", "GPU_MEM_PER_DEVICE=2000000000", "NVIDIA_VISIBLE_DEVICES=1"), None, log
    )
    assert spec == "gpu=1,mem=1907M,weight=100"
    translated = [kw for level, event, kw in log.lines if event == "translated"]
    assert translated == [
        {
            "dialect": "aliyun-egpu",
            "variables": "AMP_VGPU_ENABLE='1' GPU_MEM_PER_DEVICE='2000000000' NVIDIA_VISIBLE_DEVICES='1'",
            "share": "gpu=1,mem=1907M,weight=100",
        }
    ]
    # VMGPU alone is passed on as given, and an unrelated container asks for nothing
    assert oci.share_of(_config("VMGPU=gpu=0,mem=4G")) == "gpu=0,mem=4G"
    assert oci.share_of(_config("HOME=/root")) is None


def test_share_of_logs_what_is_not_enforced_even_when_no_gpu_is_asked():
    log = _Log()
    assert oci.share_of(_config("ALIYUN_COM_GPU_MEM_DEV=15"), None, log) is None
    assert [(lvl, ev) for lvl, ev, _ in log.lines] == [("warning", "not enforced")]


class _Vmgpud:
    """vmgpud as the runtime's create sees it: the admission records the spec, then refuses."""

    def __init__(self):
        self.admitted = []
        self.labels = []

    def status(self):
        gpu = type("G", (), {"index": 0})
        return type("S", (), {"slices": [], "gpus": [gpu, type("G", (), {"index": 1})]})()

    def admit(self, guest, kind, spec, label=None):
        self.admitted.append((guest, kind, spec))
        self.labels.append(label)
        raise Refused(f"guest {guest}: GPU 0: memory: asked a lot, free 4 MiB")

    def release(self, guest):
        return True

    def close(self):
        pass


def _create(tmp_path, monkeypatch, config, cid="f" * 64, **settings):
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(config))
    rt = oci.Runtime({"shm_dir": str(tmp_path / "shm"), "runc": "true", "libdir": str(tmp_path), **settings})
    fake = _Vmgpud()
    monkeypatch.setattr(rt, "_client", lambda: fake)
    rc = rt.main(["--root", str(tmp_path / "runc-root"), "create", "--bundle", str(bundle), cid])
    return rc, fake


def test_the_runtimes_create_admits_the_translated_share(tmp_path, monkeypatch):
    rc, fake = _create(tmp_path, monkeypatch, _config("EGPU=POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10"))
    assert rc == 1  # the fake refuses after recording what it was asked
    assert fake.admitted == [("ctr-ffffffffffff", "container", "gpu=0,mem=3276M,weight=10")]
    rc, fake = _create(tmp_path, monkeypatch, _config("NVIDIA_VISIBLE_DEVICES=all"))
    assert fake.admitted[0][2] == "gpu=0,mem=100%,weight=100;gpu=1,mem=100%,weight=100"  # vmgpud's GPUs


def test_the_runtimes_create_refuses_a_contradictory_mix_before_admitting(tmp_path, monkeypatch, capsys):
    rc, fake = _create(tmp_path, monkeypatch, _config("VMGPU=gpu=0,mem=4G", "boyue_GMEM=2048"))
    assert rc == 1 and fake.admitted == []
    err = capsys.readouterr().err
    assert "VMGPU" in err and "boyue_GMEM" in err and "[INVALID_SPEC]" in err


# ---- the guest's settings a dialect gives ----------------------------------------------------


def test_alibaba_egpus_oom_script_given_by_name_is_the_guests_oom_script_and_a_path_never_runs():
    env = {"AMP_VGPU_ENABLE": "1", "NVIDIA_VISIBLE_DEVICES": "0", "ALIYUN_COM_GPU_OOM_SCRIPT": "notify"}
    assert share(env) == "gpu=0,mem=100%,weight=100;oom-script=notify"
    for path in ("/bin/oom.sh", "../notify", "notify; reboot", "$(reboot)"):
        t = dialects.translate({**env, "ALIYUN_COM_GPU_OOM_SCRIPT": path})
        assert t.text == "gpu=0,mem=100%,weight=100", path  # no setting: the host's script, if any
        assert any(n.startswith("ALIYUN_COM_GPU_OOM_SCRIPT is not run") for n in t.notes), t.notes


def test_a_dialects_oom_script_must_agree_with_vmgpus_settings():
    env = {"AMP_VGPU_ENABLE": "1", "NVIDIA_VISIBLE_DEVICES": "0", "ALIYUN_COM_GPU_OOM_SCRIPT": "notify"}
    assert "which VMGPU does not carry" in refusal({**env, "VMGPU": "gpu=0,mem=100%"})
    assert "give one, or make them agree" in refusal({**env, "VMGPU": "gpu=0,mem=100%;oom-script=other"})
    assert share({**env, "VMGPU": "gpu=0,mem=100%;oom-script=notify"}) == "gpu=0,mem=100%,weight=100;oom-script=notify"


# ---- the container's label: what the operator knows it by --------------------------------------

CID = "0123456789abcdef" * 4


def _record(root, cid=CID, text=None, name="/web-1"):
    d = root / "containers" / cid
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.v2.json").write_text(text if text is not None else json.dumps({"ID": cid, "Name": name}))
    return d / "config.v2.json"


def test_a_containers_label_is_its_annotation_else_its_kubernetes_name_else_its_docker_name(tmp_path):
    rt = oci.Runtime({"docker_root": str(tmp_path)})
    _record(tmp_path)
    assert rt.label({}, CID) == "web-1"  # docker passes no name: dockerd's record of the container has it
    assert rt.label({"annotations": {"io.kubernetes.cri.container-name": "app"}}, CID) == "app"
    pod = {"io.kubernetes.cri.container-name": "app", "io.kubernetes.cri.sandbox-name": "pod-7"}
    assert rt.label({"annotations": pod}, CID) == "pod-7/app"
    assert rt.label({"annotations": {**pod, "vmgpu.label": "mine"}}, CID) == "mine"
    assert rt.label({"annotations": ["not", "a", "map"]}, CID) == "web-1"
    assert rt.label({}, "f" * 64) == ""  # no record: no label


def test_a_containers_docker_record_is_read_only_where_docker_could_have_written_it(tmp_path):
    rt = oci.Runtime({"docker_root": str(tmp_path)})
    rec = _record(tmp_path)
    assert rt.label({}, "../../etc/" + CID[10:]) == ""  # an id is 64 hex digits, never a path
    assert rt.label({}, CID.upper()) == ""
    rec.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"Name": "/planted"}))
    rec.symlink_to(tmp_path / "elsewhere.json")
    assert rt.label({}, CID) == ""  # never through a link
    rec.unlink()
    _record(tmp_path, text="{not json")
    assert rt.label({}, CID) == ""
    _record(tmp_path, text=json.dumps({"Name": ["/x"]}))
    assert rt.label({}, CID) == ""
    _record(tmp_path, text=json.dumps({"Name": "/x", "pad": "y" * oci.DOCKER_RECORD_MAX}))
    assert rt.label({}, CID) == ""  # too big to be docker's record
    if os.geteuid() == 0:
        _record(tmp_path)
        os.chown(rec, 65534, 65534)
        assert rt.label({}, CID) == ""  # another user's file is no record of dockerd's


def test_the_runtimes_create_gives_vmgpud_the_containers_docker_name(tmp_path, monkeypatch):
    _record(tmp_path / "docker")
    bundle_config = _config("VMGPU=gpu=0,mem=1G")
    rc, fake = _create(tmp_path, monkeypatch, bundle_config, CID, docker_root=str(tmp_path / "docker"))
    assert rc == 1 and fake.admitted == [("ctr-0123456789ab", "container", "gpu=0,mem=1G")]
    assert fake.labels == ["web-1"]
