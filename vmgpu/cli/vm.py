"""`vmgpu vm attach|detach|show`: a libvirt domain's GPU share and region device."""

from __future__ import annotations

import click

from vmgpu import names
from vmgpu.cli import render
from vmgpu.cli.common import CONNECT, Group, as_json


@click.group(cls=Group)
def vm() -> None:
    """libvirt domains: give one a GPU share, take it away, show it (edits the persistent
    definition; a running domain gets it at its next start)."""


@vm.command("attach")
@click.argument("domain_name", metavar="DOMAIN", callback=lambda c, p, v: names.check_guest(v, "domain name"))
@click.option("--gpu", help="GPU index or UUID (one slice; use --spec for several).")
@click.option("--mem", help="Memory: MiB, with a unit (8G), or a share of the card (25%).")
@click.option("--compute", type=int, default=100, show_default=True, help="Compute share in percent.")
@click.option("--spec", "spec_text", help='The whole share instead: "gpu=0,mem=8G,compute=50;gpu=1,...".')
@click.option("--heap", default="256M", show_default=True, help="Pinned host memory for the guest (sizes the region).")
@CONNECT
@as_json()
def vm_attach(domain_name, gpu, mem, compute, spec_text, heap, uri, as_json):
    """Give DOMAIN a GPU share and its shared-memory region device (replaces an earlier one)."""
    from vmgpu import spec
    from vmgpu.config import parse_size
    from vmgpu.virt.libvirt_domains import Domains

    share = spec.from_options(gpu, mem, compute, spec_text)
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
    """DOMAIN's GPU share and region device as defined, and what is wrong with them if anything."""
    from vmgpu.virt.libvirt_domains import Domains

    with Domains(uri) as doms:
        out = doms.show(domain_name)
    render.emit(out, as_json, render.vm)


COMMANDS = (vm,)
