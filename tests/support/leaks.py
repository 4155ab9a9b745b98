"""What a WebRTC viewer may leave behind on a proxy, counted after each WHEP test: aiortc's and
aioice's tasks still pending on the proxies' loop (an ICE connect a closed peer connection left
running is "destroyed but pending" when the loop stops), the viewer gauge, and this process's
UDP sockets (each peer connection binds its ICE candidates' sockets; the proxies run in this
process, and the tests' own aiortc clients are closed by the time this counts)."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from typing import Any

from rtvideo.proxy.app import ProxyServer
from tests.support.proxy_host import ProxyHost

#: what names a WebRTC task: aiortc's peer connection, or its modules' (aiortc, aioice) code
_MARKS = ("RTCPeerConnection", "aiortc", "aioice")


def _is_webrtc(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    qualname = getattr(coro, "__qualname__", "")
    code = getattr(coro, "cr_code", None)
    filename = code.co_filename if code is not None else ""
    return any(mark in qualname or f"{os.sep}{mark}{os.sep}" in filename for mark in _MARKS)


async def pending_webrtc_tasks() -> list[str]:
    """The qualnames of the WebRTC tasks pending on the running loop (call it on the proxies' loop)."""
    return sorted(
        getattr(task.get_coro(), "__qualname__", repr(task))
        for task in asyncio.all_tasks()
        if not task.done() and _is_webrtc(task)
    )


def webrtc_tasks(proxies: ProxyHost) -> list[str]:
    """The qualnames of the WebRTC tasks pending on the proxies' loop now."""
    return proxies.call(pending_webrtc_tasks())


def udp_sockets() -> int:
    """This process's open UDP sockets (IPv4 and IPv6): its socket fds whose inode a UDP table lists."""
    inodes: set[str] = set()
    for table in ("/proc/self/net/udp", "/proc/self/net/udp6"):
        try:
            with open(table) as rows:
                next(rows)  # the header
                inodes.update(row.split()[9] for row in rows)
        except FileNotFoundError:
            continue
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count


def viewer_gauge(server: ProxyServer) -> float:
    """`rtvideo_proxy_whep_viewers` as the server's /metrics says it."""
    query = f"?token={server.settings.token}" if server.settings.token is not None else ""
    url = f"http://127.0.0.1:{server.port}/metrics{query}"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("rtvideo_proxy_whep_viewers ")
    )


async def _snapshot(servers: list[ProxyServer]) -> tuple[int, list[str]]:
    return sum(len(server.whep_viewers) for server in servers), await pending_webrtc_tasks()


def assert_nothing_left(
    proxies: ProxyHost, servers: list[ProxyServer], udp_before: int | None, timeout: float = 30.0
) -> None:
    """No viewer, no WebRTC task on the proxies' loop, the gauges at 0 and no more UDP sockets
    than before the test. Waits (`timeout` only bounds a failure) until the viewers are gone;
    from that moment no task of theirs may remain: the tasks are looked at in the same loop turn
    as the viewers are counted (a connect task that outlives its closed peer connection may end
    on its own soon after, or be destroyed pending when the loop stops). The sockets' release
    takes a loop turn or two after the close: polled (`udp_before` None: not counted, while the
    test's own clients still hold theirs)."""
    deadline = time.monotonic() + timeout
    while (snapshot := proxies.call(_snapshot(servers)))[0]:
        assert time.monotonic() < deadline, f"viewers left: {snapshot}"
        time.sleep(0.1)
    assert snapshot[1] == [], f"WebRTC tasks left pending on the proxy's loop: {snapshot[1]}"
    while True:
        gauges = [viewer_gauge(server) for server in servers]
        udp = 0 if udp_before is None else udp_sockets() - udp_before
        if not any(gauges) and udp <= 0:
            return
        assert time.monotonic() < deadline, f"left behind: viewer gauges {gauges}, {udp} more UDP sockets"
        time.sleep(0.1)
