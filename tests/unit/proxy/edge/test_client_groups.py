"""Per-client bounds, without Triton: addresses grouped by network prefix (IPv4 /32 and IPv6
/64 by default, configurable), and the waiting share held per client (rtvideo.proxy.edge.waiting):
one client's idle upgrades never take another's places, and a burst of one client's upgrades
that start at once is queued, not refused. No timing assertion: deadlines only bound hangs."""

from __future__ import annotations

import asyncio

import pytest

from rtvideo.proxy.edge.waiting import WaitingShare
from rtvideo.proxy.placement.addresses import client_address, client_group, trusted_networks
from rtvideo.proxy.settings import ProxySettings


@pytest.mark.parametrize(
    "address,group",
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2::a", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("[2001:db8:1:2::a]", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),  # a dual-stack socket's IPv4 client is that IPv4 client
        ("::1", "::/64"),
        ("127.0.0.2", "127.0.0.2"),
        ("not an address", "not an address"),
    ],
)
def test_addresses_are_grouped_by_their_network(address: str, group: str) -> None:
    assert client_group(address) == group
    assert ProxySettings().client_group(address) == group


def test_the_prefixes_are_settings() -> None:
    wide = ProxySettings(address_prefix_v4=24, address_prefix_v6=48)
    assert wide.client_group("198.51.100.9") == wide.client_group("198.51.100.200") == "198.51.100.0/24"
    assert wide.client_group("198.51.101.9") != wide.client_group("198.51.100.9")
    assert wide.client_group("2001:db8:1:2::a") == wide.client_group("2001:db8:1:ff::b") == "2001:db8:1::/48"
    assert wide.client_group("::ffff:198.51.100.9") == "198.51.100.0/24"
    exact = ProxySettings(address_prefix_v6=128)
    assert exact.client_group("2001:db8::a") != exact.client_group("2001:db8::b")
    for bad in (
        {"address_prefix_v4": 33},
        {"address_prefix_v4": 4},
        {"address_prefix_v6": 129},
        {"address_prefix_v6": 16},
    ):
        with pytest.raises(ValueError, match="address_prefix"):
            ProxySettings(**bad)  # type: ignore[arg-type]


def test_a_forwarded_ipv6_client_is_grouped_like_a_direct_one() -> None:
    """Behind a trusted proxy the client is the X-Forwarded-For entry; grouping applies to it."""
    trusted = trusted_networks(["10.0.0.0/8"])
    one = client_address("10.0.0.5", "2001:db8:1:2::a", trusted)
    other = client_address("10.0.0.5", "198.51.100.1, 2001:db8:1:2::b", trusted)
    assert client_group(one) == client_group(other) == "2001:db8:1:2::/64"
    assert client_group(client_address("192.0.2.1", "2001:db8:9::1", trusted)) == "192.0.2.1"  # not believed


@pytest.mark.parametrize(
    "max_connections,explicit,per_client,part",
    [
        (64, 0, 0, 4),
        (16, 0, 0, 2),
        (8, 0, 0, 2),
        (2, 0, 0, 2),
        (1, 0, 0, 1),
        (64, 0, 6, 6),
        (64, 10, 0, 2),
        (8, 0, 40, 4),
    ],
)
def test_each_client_has_a_part_of_the_waiting_share(
    max_connections: int, explicit: int, per_client: int, part: int
) -> None:
    settings = ProxySettings(
        max_connections=max_connections,
        max_sessions_per_client=1,
        max_awaiting_start=explicit,
        max_awaiting_start_per_client=per_client,
    )
    assert settings.awaiting_start_per_client == part <= settings.awaiting_start_bound
    with pytest.raises(ValueError, match="max_awaiting_start_per_client"):
        ProxySettings(max_awaiting_start_per_client=-1)


class Conn:
    """A waiting connection as the share sees it; `displaced` says how long it held its place."""

    def __init__(self, group: str, share: WaitingShare[Conn]) -> None:
        self.group, self.share = group, share
        self.displaced: float | None = None

    def displace(self, held: float) -> None:
        self.displaced = held
        self.share.leave(self)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_one_clients_idle_upgrades_never_take_another_clients_place() -> None:
    async def body() -> None:
        share: WaitingShare[Conn] = WaitingShare(bound=8, part=2, grace=3600.0)  # nobody is displaced
        flooder = [Conn("198.51.100.1", share) for _ in range(12)]
        placed = [share.place(c) for c in flooder]
        assert placed == [True, True] + [False] * 10 and share.held("198.51.100.1") == 2
        held = [asyncio.ensure_future(share.enter(c, 0.3)) for c in flooder[2:]]  # queued, then refused
        others = [Conn(f"2001:db8:{i}::1", share) for i in range(3)]
        assert [share.place(c) for c in others] == [True] * 3  # other clients: places at once
        assert await asyncio.gather(*held) == [False] * 10
        assert share.held("198.51.100.1") == 2 and len(share) == 5
        assert all(c.displaced is None for c in flooder + others)

    run(body())


def test_an_idle_waiter_gives_its_place_to_its_own_clients_newcomer_after_the_grace() -> None:
    async def body() -> None:
        share: WaitingShare[Conn] = WaitingShare(bound=8, part=1, grace=0.2)
        idle, other = Conn("a", share), Conn("b", share)
        assert share.place(idle) and share.place(other)
        newcomer = Conn("a", share)
        assert await share.enter(newcomer, 30.0)  # let in once the idle one held its place 0.2 s
        assert idle.displaced is not None and idle.displaced >= 0.2
        assert other.displaced is None and newcomer in share and idle not in share

    run(body())


def test_a_full_share_displaces_the_oldest_idle_waiter_of_any_client_for_another() -> None:
    async def body() -> None:
        share: WaitingShare[Conn] = WaitingShare(bound=3, part=2, grace=0.2)
        a1, a2, b1 = Conn("a", share), Conn("a", share), Conn("b", share)
        assert share.place(a1) and share.place(a2) and share.place(b1)
        c1 = Conn("c", share)
        assert not share.place(c1)  # full, and everyone is within the grace
        assert await share.enter(c1, 30.0)
        assert a1.displaced is not None and a2.displaced is None and b1.displaced is None

    run(body())


def test_a_burst_of_one_clients_upgrades_that_each_start_at_once_is_not_refused() -> None:
    """40 upgrades of one client with a part of 4: each placed one starts (leaves) a moment
    later; the rest wait in order and every one gets a place; nobody is displaced."""

    async def body() -> None:
        share: WaitingShare[Conn] = WaitingShare(bound=16, part=4, grace=3600.0)
        order: list[int] = []

        async def client(i: int) -> bool:
            conn = Conn("127.0.0.1", share)
            if not await share.enter(conn, 30.0):
                return False
            order.append(i)
            await asyncio.sleep(0.01)  # its start is read
            share.leave(conn)
            return conn.displaced is None

        assert await asyncio.gather(*(client(i) for i in range(40))) == [True] * 40
        assert len(share) == 0 and order[:4] == [0, 1, 2, 3] and sorted(order) == list(range(40))
        assert order == list(range(40))  # queued ones of one client go in the order they came

    run(body())


def test_a_queued_upgrade_whose_client_leaves_frees_its_place_in_the_queue() -> None:
    async def body() -> None:
        share: WaitingShare[Conn] = WaitingShare(bound=4, part=1, grace=3600.0)
        first, gone, later = Conn("a", share), Conn("a", share), Conn("a", share)
        assert share.place(first)
        waits = asyncio.ensure_future(share.enter(gone, 30.0))
        then = asyncio.ensure_future(share.enter(later, 30.0))
        await asyncio.sleep(0.05)
        share.leave(gone)  # its client closed the connection while it was held
        assert await waits is False
        share.leave(first)
        assert await then is True and share.held("a") == 1

    run(body())
