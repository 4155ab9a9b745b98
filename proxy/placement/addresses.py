"""Triton endpoint addresses: `HOST:PORT` as the `--triton-url` setting gives them (no imports
beyond the standard library: the settings check them before anything starts)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def split_address(url: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 address in brackets) → (host, port); ValueError when it is not one."""
    text = url.strip()
    host, sep, port = text.rpartition(":")
    bad = ValueError(f"Triton URL {url!r}: give HOST:PORT (no scheme; an IPv6 address in brackets)")
    if "://" in text or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad from None
    elif ":" in host or "[" in host or "]" in host or "/" in host or any(c.isspace() for c in host):
        raise bad
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_urls(urls: str | Iterable[str]) -> tuple[str, ...]:
    """Comma-separated (and/or several) `HOST:PORT`, each checked, duplicates dropped."""
    parts = urls.split(",") if isinstance(urls, str) else [p for u in urls for p in u.split(",")]
    found = tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))
    if not found:
        raise ValueError("no Triton URL given")
    for url in found:
        split_address(url)
    return found


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """`--trusted-proxy` entries (an address or a CIDR network) as networks; ValueError naming a bad one."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"trusted proxy {entry!r}: give an IP address or a network such as 10.0.0.0/8") from None
    return tuple(networks)


def is_trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded_for: str | None, networks: tuple[Network, ...]) -> str:
    """The client a request comes from: the socket's `peer`, unless the peer is a trusted proxy;
    then the rightmost `X-Forwarded-For` entry that is not itself trusted (entries left of it
    are the client's to write, so they are never believed). A header that is not a list of
    addresses leaves the peer: an ingress we trust writes well-formed ones."""
    if not forwarded_for or not networks or not is_trusted(peer, networks):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",")][-32:]
    for hop in reversed(hops):
        try:
            address = str(ipaddress.ip_address(hop.strip("[]")))
        except ValueError:
            return peer
        if not is_trusted(address, networks):
            return address
    return peer


#: the default network prefixes a client address is grouped by (`client_group`): an IPv4 address
#: is one client, an IPv6 client holds (at least) a /64, the smallest subnet a provider hands out
DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6 = 32, 64


def client_group(address: str, prefix_v4: int = DEFAULT_PREFIX_V4, prefix_v6: int = DEFAULT_PREFIX_V6) -> str:
    """The group every per-client bound counts `address` against: its network of `prefix_v4`
    (IPv4) or `prefix_v6` (IPv6) bits, as text (`203.0.113.7`, `2001:db8:1:2::/64`). An
    IPv4-mapped IPv6 address (`::ffff:203.0.113.7`, a dual-stack socket's IPv4 client) is the
    IPv4 address it maps; anything that is not an address (a Unix socket's peer) is its own group.

    Invariant: one function groups for every bound (open connections, the waiting share, the
    share of model slots, here and in the shared store), so a client cannot be one client to one
    bound and many to another."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = prefix_v4 if isinstance(ip, ipaddress.IPv4Address) else prefix_v6
    if prefix >= ip.max_prefixlen:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
