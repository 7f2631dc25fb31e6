"""Client addresses, as the HTTP server and the access rules see them.

Contracts:
- An IPv4 address mapped into IPv6 (::ffff:a.b.c.d, a dual-stack socket) is
  that IPv4 address.
- The per-address connection cap counts an IPv6 client by its /64: one
  subscriber usually holds a whole /64, so counting single addresses would let
  it open unbounded connections.
- Loopback is 127.0.0.0/8 and ::1; a host that is not an IP address (a Unix
  socket, a test client's name) is not loopback.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address(host: str | None) -> IPAddress | None:
    """`host` as an IP address (IPv4-mapped IPv6 unwrapped), or None if it is none."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return None
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def client_key(host: str) -> str:
    """What the per-address cap counts `host` under: the IPv4 address, or the IPv6 /64."""
    ip = address(host)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip) if ip is not None else host


def is_loopback(host: str | None) -> bool:
    """Whether `host` is this machine's loopback address."""
    ip = address(host)
    return ip is not None and ip.is_loopback
