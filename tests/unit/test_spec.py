"""The share-spec grammar: one parser for containers' variable and VMs' XML, errors that
name the slice and the field."""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vmgpu.spec import XML_NS, Slice, SpecError, from_xml, parse


def test_text_form():
    s = parse("gpu=0,mem=8G,compute=50; GPU=1, MEM=25%  ;gpu=GPU-2334bcfe-b020-635c-eae9-8d9e7483b949,mem=512")
    assert s.slices == (
        Slice("0", mem_mib=8192, compute=50),
        Slice("1", mem_fraction=0.25, compute=100),
        Slice("GPU-2334bcfe-b020-635c-eae9-8d9e7483b949", mem_mib=512, compute=100),
    )
    assert s.slices[1].mem_for(32768) == 8192


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "the share spec is empty"),
        ("gpu=0", "slice 1: mem is missing"),
        ("mem=1G", "slice 1: gpu is missing"),
        ("gpu=0,mem=1G;gpu=1,mem=1G,compute=110", "slice 2: compute 110% is outside 1..100"),
        ("gpu=0,mem=1G,compute=0", "slice 1: compute 0% is outside 1..100"),
        ("gpu=0,mem=lots", "slice 1: mem 'lots' is not a size"),
        ("gpu=0,mem=0", "slice 1: mem 0 must be a whole number of MiB, at least 1"),
        ("gpu=0,mem=150%", "slice 1: mem 150% must be more than 0% and at most 100%"),
        ("gpu=zero,mem=1G", "slice 1: gpu 'zero' is neither an index nor a UUID"),
        ("gpu=0,mem=1G,colour=red", "slice 1: unknown field 'colour'"),
        ("gpu=0,mem=1G;gpu=0,mem=2G", "slice 2: gpu 0 is already given by slice 1"),
        ("gpu=0,mem=1G,mem=2G", "slice 1: mem is given twice"),
        ("gpu=0,,mem=1G", "slice 1: empty field"),
        ("gpu=0,mem", "slice 1: 'mem' is not key=value"),
    ],
)
def test_errors_name_the_slice_and_field(text, message):
    with pytest.raises(SpecError) as e:
        parse(text)
    assert message in e.value.message
    assert e.value.exit_code == 2


def test_xml_form_reads_the_same_and_round_trips():
    xml = (
        f'<vmgpu:share xmlns:vmgpu="{XML_NS}"><vmgpu:slice gpu="0" mem="8G" compute="50"/>'
        f'<vmgpu:slice gpu="2" mem="10%"/></vmgpu:share>'
    )
    s = from_xml(ET.fromstring(xml))
    assert s == parse("gpu=0,mem=8G,compute=50;gpu=2,mem=10%")
    assert from_xml(s.to_xml()) == s
    with pytest.raises(SpecError, match="slice 1: compute 101% is outside"):
        from_xml(ET.fromstring(f'<s:share xmlns:s="{XML_NS}"><s:slice gpu="0" mem="1G" compute="101"/></s:share>'))


slices = st.builds(
    lambda gpu, mem, compute: f"gpu={gpu},mem={mem},compute={compute}",
    st.integers(0, 15),
    st.one_of(st.integers(1, 1 << 20).map(lambda m: f"{m}M"), st.integers(1, 100).map(lambda p: f"{p}%")),
    st.integers(1, 100),
)


@given(st.lists(slices, min_size=1, max_size=6, unique_by=lambda s: s.split(",")[0]))
def test_text_round_trip(parts):
    s = parse(";".join(parts))
    assert parse(s.to_text()) == s
    assert from_xml(s.to_xml()) == s
