"""`vmgpu vm attach|detach|show`: a libvirt domain's GPU share and region device."""

from __future__ import annotations

import click

from vmgpu import names, spec
from vmgpu.cli import render
from vmgpu.cli.common import CONNECT, Group, as_json


@click.group(cls=Group)
def vm() -> None:
    """libvirt domains: give one a GPU share, take it away, show it (edits the persistent
    definition; a running domain gets it at its next start)."""


# one slice's fields, by their key in the share grammar (vmgpu/spec.py): option name -> key
_SLICE_OPTIONS = ("gpu", "mem", "weight", "guarantee", "cap", "priority")
_SETTING_OPTIONS = {"oom_script": "oom-script", "peer_timeout": "peer-timeout"}


def share_from_options(spec_text: str | None, compute: str | None, **given: str | None):
    """The share of `vmgpu vm attach`: the whole spec (--spec), or one slice from --gpu, --mem,
    --weight (--compute, its old name), --guarantee, --cap and --priority and the guest's own
    settings from --oom-script and --peer-timeout, written as the share grammar and parsed by it,
    so that the options and `vmgpu admit`'s SPEC mean the same and fail the same."""
    from vmgpu.errors import InvalidArgument

    if compute is not None:
        if given.get("weight") is not None:
            raise InvalidArgument("--compute is the old name of --weight: give one of them")
        given["weight"] = compute
    set_opts = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    if spec_text:
        if set_opts:
            raise InvalidArgument(f"give either --spec or {', '.join(set_opts)}, not both")
        return spec.parse(spec_text)
    if given.get("gpu") is None or given.get("mem") is None:
        raise InvalidArgument("give --gpu and --mem (or --spec)")
    groups = [",".join(f"{k}={given[k]}" for k in _SLICE_OPTIONS if given.get(k) is not None)]
    settings = ",".join(f"{key}={given[o]}" for o, key in _SETTING_OPTIONS.items() if given.get(o) is not None)
    if settings:
        groups.append(settings)
    return spec.parse(";".join(groups))


@vm.command("attach")
@click.argument("domain_name", metavar="DOMAIN", callback=lambda c, p, v: names.check_guest(v, "domain name"))
@click.option("--gpu", help="GPU index or UUID (one slice; use --spec for several).")
@click.option("--mem", help="Memory: MiB, with a unit (8G), or a share of the card (25%).")
@click.option("--weight", help="Compute weight, 1..100, relative to the other guests' (default 100; reserves nothing).")
@click.option("--compute", help="The old name of --weight.")
@click.option("--guarantee", help="Share of the GPU's time reserved at admission, 1..100% (default: none).")
@click.option(
    "--cap", help="The most of its throughput alone the guest may have, 1..100%, even on an idle card (default: none)."
)
@click.option("--priority", type=click.Choice(list(spec.PRIORITIES), case_sensitive=False), help="Default: normal.")
@click.option("--oom-script", help="The guest's OOM script: a name in the host's OOM-script directory.")
@click.option("--peer-timeout", help="The guest's peer timeout in seconds, 1..3600 (default: the host's).")
@click.option(
    "--spec",
    "spec_text",
    help='The whole share instead, as `vmgpu admit` takes it: "gpu=0,mem=8G,weight=50;gpu=1,...;oom-script=NAME".',
)
@click.option("--heap", default="256M", show_default=True, help="Pinned host memory for the guest (sizes the region).")
@CONNECT
@as_json()
def vm_attach(domain_name, spec_text, compute, heap, uri, as_json, **given):
    """Give DOMAIN a GPU share and its shared-memory region device (replaces an earlier one).
    The share's fields are `vmgpu admit`'s: --weight, --guarantee, --cap and --priority for the
    slice, --oom-script and --peer-timeout for the guest's own forwarder settings (unset: the
    host's)."""
    from vmgpu.config import parse_size
    from vmgpu.virt.libvirt_domains import Domains

    share = share_from_options(spec_text, compute, **given)
    with Domains(uri) as doms:
        out = doms.attach(domain_name, share, parse_size(heap) >> 20)
    render.emit(out, as_json, render.vm)


@vm.command("detach")
@click.argument("domain_name", metavar="DOMAIN")
@CONNECT
def vm_detach(domain_name, uri):
    """Take DOMAIN's GPU share and region device away."""
    from vmgpu.virt.libvirt_domains import Domains

    with Domains(uri) as doms:
        had = doms.detach(domain_name)
    click.echo(f"detached vmgpu from {domain_name}" if had else f"{domain_name} had no vmgpu share")


@vm.command("show")
@click.argument("domain_name", metavar="DOMAIN")
@CONNECT
@as_json()
def vm_show(domain_name, uri, as_json):
    """DOMAIN's GPU share, its own forwarder settings and its region device as defined, and what
    is wrong with them if anything."""
    from vmgpu.virt.libvirt_domains import Domains

    with Domains(uri) as doms:
        out = doms.show(domain_name)
    render.emit(out, as_json, render.vm)


COMMANDS = (vm,)
