"""The host's network as the pool needs it, read over netlink with pyroute2 (the one module that
imports it): the data-plane address of an interface named by the operator (`--bind-net eth1`,
as boyue's bind_net), and the route and MTU this host would use to reach another."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from vmgpu.errors import InvalidArgument, NotFound

# an MTU below this fragments the data plane's chunks: `vmgpu doctor` warns
MIN_MTU = 1500


def interface_address(ifname: str, family: int = socket.AF_INET) -> str:
    """The first address of interface ifname (IPv4 unless family says otherwise); NotFound
    naming the interface and what it lacks."""
    if not ifname or len(ifname) > 15 or "/" in ifname or not ifname.isprintable():
        raise InvalidArgument(f"interface name {ifname[:20]!r} is not one (1 to 15 characters, no '/')")
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise NotFound(f"interface {ifname} does not exist on this host: see `ip link`")
        link = ipr.get_links(found[0])[0]
        if link.get("operstate") not in ("UP", "UNKNOWN"):
            raise NotFound(
                f"interface {ifname} is {link.get('operstate', 'down')}: bring it up (ip link set {ifname} up)"
            )
        addrs = [a.get("address") for a in ipr.get_addr(index=found[0], family=family)]
    addrs = [a for a in addrs if a and not ipaddress.ip_address(a).is_link_local]
    if not addrs:
        fam = "IPv4" if family == socket.AF_INET else "IPv6"
        raise NotFound(f"interface {ifname} has no {fam} address: give it one, or name another (--bind-net)")
    return addrs[0]


@dataclass(frozen=True)
class Route:
    destination: str
    interface: str
    source: str
    gateway: str
    mtu: int


def route_to(address: str) -> Route:
    """The route the kernel would take to address, and the MTU on it (the route's own, else its
    interface's); NotFound where there is none."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise InvalidArgument(f"{address[:64]!r} is not an IP address") from None
    with IPRoute() as ipr:
        try:
            routes = ipr.route("get", dst=str(ip))
        except NetlinkError as e:
            raise NotFound(f"no route to {ip}: {e.args[-1] if e.args else e}") from None
        if not routes:
            raise NotFound(f"no route to {ip}")
        r = routes[0]
        oif = r.get("oif")
        link = ipr.get_links(oif)[0] if oif else None
        metrics = r.get("metrics")
        mtu = (metrics.get("mtu") if metrics is not None else None) or (link.get("mtu") if link is not None else 0)
        return Route(
            str(ip),
            link.get("ifname") if link is not None else "?",
            r.get("prefsrc") or "",
            r.get("gateway") or "",
            int(mtu or 0),
        )
