"""Proxy settings: each declared once; command-line flags whose defaults come from `RTVIDEO_<NAME>`."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from rtvideo import settings_text
from rtvideo.proxy.placement.addresses import (
    DEFAULT_PREFIX_V4,
    DEFAULT_PREFIX_V6,
    client_group,
    parse_urls,
    trusted_networks,
)
from rtvideo.proxy.store import check_store
from rtvideo.proxy.store.base import LEASE_SECONDS
from rtvideo.settings_text import setting

MiB = 1024 * 1024
#: a connection waiting for its session.start this long may lose its place to a new upgrade when
#: the waiting share (`awaiting_start_bound`) is full: a client sends its start right after the
#: upgrade, so one that waited this long is idle (or held open on purpose)
AWAITING_START_GRACE_SECONDS = 2.0
#: an upgrade over its client's part of the waiting share is held (not yet answered) this long for
#: a place of that client's to free: a burst of clients that each start at once gets in as the
#: earlier ones start, and an idle waiter of the same client gives its place after the grace
AWAITING_PLACE_SECONDS = 2 * AWAITING_START_GRACE_SECONDS
#: a takeover waits this much past the lease for the old holder's lease to lapse (its last renewal
#: may be late by a loaded machine's pause), so that a dead holder's session is taken in one try
TAKEOVER_MARGIN_SECONDS = 2.0
#: connections to the health listener idle this long are closed (a probe sends one request)
HEALTH_IDLE_SECONDS = 5.0
#: a WHEP viewer's ICE must connect within this long of its answer (`whep_connect_seconds`)
WHEP_CONNECT_SECONDS = 30.0
#: the longest --resume-grace-seconds: below the model's MAX_PAUSE_SECONDS, so a detached session's
#: generator stays paused for all of it
MAX_RESUME_GRACE_SECONDS = 300.0


@dataclass(frozen=True)
class ProxySettings:
    """Everything the WebSocket proxy needs; the defaults are the documented ones."""

    host: str = setting("127.0.0.1", "address the proxy listens on")
    port: int = setting(8080, "port of the proxy")
    triton_url: str = setting(
        "127.0.0.1:8001",
        "Triton gRPC HOST:PORT (no scheme), several comma-separated; a HOST name counts as "
        "one endpoint per address it resolves to",
    )
    model: str = setting("realtime_video", "Triton model name")
    triton_metrics_port: int = setting(
        8002,
        "Triton's metrics port (HTTP /metrics) on each Triton host: when a health probe gets no answer, "
        "the model's heartbeat there tells a busy model (every sequence slot held) from a dead one "
        "(0: not read; no answer is a failure)",
    )
    triton_key: str | None = setting(
        None,
        "Triton's access key (its --grpc-restricted-protocol key rtvideo-key), sent as a header on every "
        "gRPC call; `rtvideo serve` generates one for a Triton it starts on loopback",
        secret=True,
    )
    resolve_interval: float = setting(10.0, "seconds between resolutions of the Triton host names (0: only at start)")
    drain_seconds: float = setting(
        30.0,
        "on SIGTERM, seconds live sessions may run on before server_shutdown (with a shared "
        "--session-store, a resumable session is handed off at once instead: close 1012)",
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        "extra allowed browser Origin, scheme://host[:port] (repeatable; '*' allows any); "
        "same-origin and localhost pages always pass",
        flag="--allow-origin",
    )
    allowed_hosts: tuple[str, ...] = setting(
        (),
        "extra allowed Host name (repeatable; '*' allows any). Bound to loopback, only this "
        "machine's names pass; bound elsewhere, any name passes unless names are listed",
        flag="--allowed-host",
    )
    token: str | None = setting(
        None, "bearer token clients must present (Authorization: Bearer, or ?token=)", secret=True
    )
    admin_token: str | None = setting(
        None,
        "the operator's credential (Authorization: Bearer): it alone opens the drain, the full recordings "
        "listing and deleting any recording; unset, those answer 403 (docs/security.md). Give it as "
        "RTVIDEO_ADMIN_TOKEN, not on a command line",
        secret=True,
    )
    trusted_proxies: tuple[str, ...] = setting(
        (),
        "address or network (CIDR) of an ingress or load balancer whose X-Forwarded-For names the client "
        "(repeatable); from any other peer the header is ignored",
        flag="--trusted-proxy",
    )
    address_prefix_v4: int = setting(
        DEFAULT_PREFIX_V4,
        "IPv4 addresses in one network of this many bits are one client to every per-client bound "
        "(open connections, the waiting share, the share of model slots; 8 to 32)",
    )
    address_prefix_v6: int = setting(
        DEFAULT_PREFIX_V6,
        "IPv6 addresses in one network of this many bits are one client to every per-client bound "
        "(a subscriber holds at least a /64; 32 to 128)",
    )
    max_connections: int = setting(64, "concurrent WebSocket sessions (HTTP 503 beyond)")
    max_sessions_per_client: int = setting(
        0,
        "concurrent sessions from one client address (a start beyond is server_busy; a resume does not count); "
        "0: half the model's session slots this proxy knows of, at least 1 (16 until every capacity is known)",
    )
    max_open_connections: int = setting(
        1024, "open TCP connections of any kind (WebSocket, HTTP, idle); a new one beyond is closed at once"
    )
    max_open_connections_per_client: int = setting(
        64, "open TCP connections of any kind from one client address; a new one beyond is closed at once"
    )
    http_idle_seconds: float = setting(
        30.0,
        "close a connection that sends no complete request head (an idle keep-alive included), or "
        "no announced body, within this many seconds",
    )
    health_port: int | None = setting(
        None,
        "port of a listener of its own for /livez /healthz /readyz /metrics (probes, scrapes), with "
        "its own connection bound, so that they answer while the main port's connections are all "
        "taken (0: any free port; off: none, the main port's routes only)",
    )
    health_max_open_connections: int = setting(
        32, "open TCP connections to the health listener (a quarter of them from one client address)"
    )
    max_awaiting_start: int = setting(
        0,
        "upgraded connections that have not sent session.start yet, at most (0: a quarter of "
        "--max-connections, at least 4); beyond, a new upgrade takes the place of one that waited "
        f"over {AWAITING_START_GRACE_SECONDS:g} s, or is refused (503)",
    )
    max_awaiting_start_per_client: int = setting(
        0,
        "of those, how many one client (--address-prefix-v4/-v6) may hold (0: a quarter of the waiting "
        "share, at least 2); beyond, its next upgrade waits for one of its own to start or to pass "
        f"{AWAITING_START_GRACE_SECONDS:g} s, at most {AWAITING_PLACE_SECONDS:g} s, then 503",
    )
    outbound_buffer_bytes: int = setting(16 * MiB, "per-session outbound buffer before slow_consumer")
    start_timeout: float = setting(10.0, "seconds to wait for session.start")
    ping_interval: float = setting(20.0, "WebSocket ping interval in seconds (0: off)")
    ping_timeout: float = setting(20.0, "close a peer that answers a ping not within this many seconds")
    probe_interval: float = setting(2.0, "seconds between health probes of the model (a round trip through it)")
    probe_timeout: float = setting(5.0, "a health probe not answered within this many seconds has failed")
    probe_failures: int = setting(2, "consecutive failed probes after which the backend is down")
    max_messages_per_second: float = setting(
        20.0, "client messages per second a session may send after session.start (rate_limited beyond)"
    )
    message_burst: int = setting(40, "client messages a session may send at once, above the rate")
    max_requests_in_flight: int = setting(
        32, "requests of one session sent to Triton and not answered yet (rate_limited beyond)"
    )
    backend_silence_seconds: float = setting(
        90.0, "end a live session with backend_unavailable when Triton sends nothing this long"
    )
    move_patience_seconds: float = setting(
        60.0,
        "a live session whose Triton is lost or drained waits this long for an endpoint to take it "
        "(the same one after a restart included) before it ends with backend_unavailable (0: moves off)",
    )
    resume_grace_seconds: float = setting(
        30.0,
        "a resumable session whose connection drops stays detached (its generator paused) this many "
        f"seconds for a session.resume (0: resume off; at most {MAX_RESUME_GRACE_SECONDS:g})",
    )
    # How long the proxy waits on others (a lease, a peer's answer, a waiting client's start). No
    # operator needs to change these (no flag); the tests shorten them where the figure is not
    # what a test checks, and keep the defaults where it is.
    lease_seconds: float = setting(
        LEASE_SECONDS,
        "with a shared --session-store, how long a replica's lease on a session lasts unless renewed "
        "(it is renewed every third of it, and a store call waits at most half of it): short enough that "
        "a client's own resume retries (about 8 s) reach a replica that can take a dead holder's session "
        "over, which it waits for at most `takeover_wait_seconds`",
        cli=False,
    )
    resume_probe_seconds: float = setting(
        2.0,
        "a resume of a session whose owner still seems attached pings that owner's connection (here or "
        "at the replica holding it): no pong within this long and it is taken for dropped",
        cli=False,
    )
    awaiting_start_grace_seconds: float = setting(
        AWAITING_START_GRACE_SECONDS,
        "a connection waiting this long for its session.start may lose its place to a new upgrade when "
        "the waiting share is full (a client sends its start right after the upgrade)",
        cli=False,
    )
    awaiting_place_seconds: float = setting(
        AWAITING_PLACE_SECONDS,
        "an upgrade over its client's part of the waiting share is held this long for a place of that "
        "client's to free, then refused (503 awaiting_start)",
        cli=False,
    )
    replay_buffer_bytes: int = setting(
        8 * MiB, "per resumable session, bytes of sent frames kept for a resume (the oldest go first)"
    )
    whep_connect_seconds: float = setting(
        WHEP_CONNECT_SECONDS,
        "a WHEP viewer whose ICE has not connected this long after its answer is ended and its place "
        "freed (an offer nobody follows up)",
        cli=False,
    )
    max_watchers_per_session: int = setting(16, "read-only watchers of one session (HTTP 503 beyond)")
    max_watchers: int = setting(256, "read-only watchers on this proxy, all sessions together (HTTP 503 beyond)")
    ice_servers: tuple[str, ...] = setting(
        (),
        "STUN/TURN server for WHEP viewers' ICE, stun:HOST[:PORT] or turn:HOST[:PORT][?transport=udp|tcp] "
        "(repeatable; none: host candidates only, for viewers that reach this address directly)",
        flag="--ice-server",
    )
    ice_username: str | None = setting(None, "username for the turn: servers of --ice-server")
    ice_credential: str | None = setting(
        None, "credential for the turn: servers of --ice-server (set it in the environment)", secret=True
    )
    watcher_buffer_bytes: int = setting(
        4 * MiB, "per watcher (and per steerer), outbound bytes waiting before it is dropped with slow_consumer"
    )
    max_steerers_per_session: int = setting(
        8, "steerers of one steerable session, besides its owner (HTTP 503 beyond; 0: steering off)"
    )
    max_steerers: int = setting(256, "steerers on this proxy, all sessions together (HTTP 503 beyond)")
    otlp_endpoint: str | None = setting(
        None,
        "OpenTelemetry collector (OTLP gRPC, http://HOST:4317) that traces of sessions and interactions go "
        "to (needs rtvideo[otel]; unset: no traces); `rtvideo serve` hands it to the model too",
        secret=True,
    )
    session_store: str = setting(
        "memory",
        "where live sessions are kept beyond this process: memory (one proxy; a restart ends its sessions) "
        "or redis://HOST:PORT/DB, shared by replicas so that any of them continues any session (needs "
        'rtvideo[redis]; docs/operations.md "When a proxy dies"). A URL with a password: give it as '
        "RTVIDEO_SESSION_STORE, not on a command line",
        secret=True,
    )
    session_store_bytes: int = setting(
        16 * MiB,
        "per session, bytes of its interactions and frames a shared --session-store keeps (its chunks' payloads "
        "are bounded beside it by --replay-buffer-bytes) and a move's log holds in memory; past it the session "
        "goes on unkept (no longer resumable at another replica) and can no longer move to another Triton",
    )
    advertise_url: str | None = setting(
        None,
        "http://HOST:PORT at which the other replicas of a shared --session-store reach this proxy: a watch "
        "or steer link that lands on another replica is forwarded here while this proxy holds its session "
        "(unset: the address it listens on; in Kubernetes the pod's IP, RTVIDEO_ADVERTISE_URL=http://$(POD_IP):8080)",
    )
    recordings: str | None = setting(
        None,
        "where session recordings are stored (docs/recordings.md): a directory, or an fsspec URL such as "
        "s3://bucket/prefix (needs rtvideo[recordings]); unset: recordings off",
        secret=True,  # an fsspec URL may carry a key: shown only through rtvideo.redaction.redact_url
    )
    recordings_max_bytes: int = setting(
        10 * 1024 * MiB, "bytes all recordings may take together; the oldest finished ones go first"
    )
    recording_max_bytes: int = setting(
        0,
        "bytes one recording may take (its video, event log and manifest); past it the recording is closed "
        "as truncated and the session goes on (0: a quarter of --recordings-max-bytes)",
    )
    recordings_max_age: float = setting(7 * 24 * 3600.0, "seconds a finished recording is kept (0: no age limit)")
    recordings_max_count: int = setting(
        10_000,
        "recordings this proxy keeps, live and finished: the oldest finished ones go first; a new one is "
        "refused while the live ones reach it (0: no count limit)",
    )
    record_all: bool = setting(False, 'record every session (else a session asks with "record": true)')
    broadcast_store: str | None = setting(
        None,
        'where HLS broadcasts are written (a session.start with "broadcast": true, docs/protocol.md '
        "§9.6): a directory, served by the proxy too, or an fsspec URL such as s3://bucket/prefix "
        "(needs rtvideo[recordings]) that a CDN serves; unset: broadcasts off",
        secret=True,  # an fsspec URL may carry a key: shown only through rtvideo.redaction.redact_url
    )
    broadcast_base_url: str | None = setting(
        None,
        "the CDN's address of the broadcast store (https://cdn.example/live): broadcast_url is then "
        "BASE/ID/index.m3u8; unset: a path on the proxy, /v1/broadcasts/ID/index.m3u8",
    )
    broadcast_window: int = setting(
        30, "chunks a broadcast's playlist lists (a live window; as many more stay on the store for late readers)"
    )
    broadcast_max_bytes: int = setting(
        64 * MiB, "bytes one broadcast keeps on the store (its oldest segments go first; the playlist lists half)"
    )
    max_broadcasts: int = setting(64, "broadcasts live on this proxy at once; a start asking for one more: server_busy")
    broadcast_retention_seconds: float = setting(
        600.0, "seconds an ended broadcast stays on the store before it is removed"
    )

    def __post_init__(self) -> None:
        self._check_resume_settings()
        self._check_ice_servers()
        if not 0 <= self.port <= 65535:  # the socket layer would take 80800 as 80800 - 65536
            raise ValueError(f"port {self.port}: use 1 to 65535 (0: any free port)")
        if (
            min(self.max_connections, self.outbound_buffer_bytes) < 1
            or self.start_timeout <= 0
            or self.max_sessions_per_client < 0
        ):
            raise ValueError(
                "max_connections, outbound_buffer_bytes and start_timeout must be positive, "
                "max_sessions_per_client >= 0"
            )
        if (
            min(self.max_messages_per_second, self.backend_silence_seconds) <= 0
            or min(self.message_burst, self.max_requests_in_flight) < 1
        ):
            raise ValueError(
                "max_messages_per_second, message_burst, max_requests_in_flight and "
                "backend_silence_seconds must be positive"
            )
        if (
            self.max_open_connections < self.max_connections
            or self.http_idle_seconds <= 0
            or self.max_open_connections_per_client < self.max_sessions_per_client
        ):
            raise ValueError(
                "max_open_connections must be at least max_connections, max_open_connections_per_client "
                "at least max_sessions_per_client; http_idle_seconds positive"
            )
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health_port {self.health_port}: use 1 to 65535 (0: any free port; off: none)")
        if self.health_port is not None and self.health_port == self.port != 0:
            raise ValueError("health_port must differ from port")
        if self.health_max_open_connections < 1 or min(self.max_awaiting_start, self.max_awaiting_start_per_client) < 0:
            raise ValueError(
                "health_max_open_connections must be positive, max_awaiting_start and "
                "max_awaiting_start_per_client >= 0"
            )
        if not (8 <= self.address_prefix_v4 <= 32 and 32 <= self.address_prefix_v6 <= 128):
            raise ValueError("address_prefix_v4 must be between 8 and 32, address_prefix_v6 between 32 and 128")
        if not 0 <= self.triton_metrics_port <= 65535:
            raise ValueError(f"triton_metrics_port {self.triton_metrics_port}: use 1 to 65535 (0: not read)")
        if self.ping_interval < 0 or self.ping_timeout <= 0:
            raise ValueError("ping_interval must be >= 0 and ping_timeout positive")
        if self.probe_interval <= 0 or self.probe_timeout <= 0 or self.probe_failures < 1:
            raise ValueError("probe_interval and probe_timeout must be positive, probe_failures at least 1")
        if (
            self.recordings_max_bytes < 1
            or min(self.recordings_max_age, self.recording_max_bytes, self.recordings_max_count) < 0
        ):
            raise ValueError(
                "recordings_max_bytes must be positive, recording_max_bytes, recordings_max_age and "
                "recordings_max_count >= 0"
            )
        if self.admin_token is not None and self.admin_token == self.token:
            raise ValueError("admin_token must differ from token: the operator's credential is not a client's")
        trusted_networks(self.trusted_proxies)  # each one parses
        if self.record_all and not self.recordings:
            raise ValueError("--record-all needs --recordings (where to store them)")
        self._check_broadcast_settings()
        if self.resolve_interval < 0 or self.drain_seconds < 0:
            raise ValueError("resolve_interval and drain_seconds must be >= 0")
        if self.move_patience_seconds < 0:
            raise ValueError("move_patience_seconds must be >= 0 (0: moves off)")
        parse_urls(self.triton_url)  # HOST:PORT, each one
        check_store(self.session_store)  # a malformed URL is refused here, its password masked
        if self.advertise_url is not None and not re.fullmatch(r"https?://[^/?#\s]+/?", self.advertise_url):
            raise ValueError(f"advertise_url {self.advertise_url!r}: use http://HOST:PORT (no path)")
        if self.ping_interval and self.ping_timeout > self.ping_interval:
            raise ValueError("ping_timeout cannot exceed ping_interval (Tornado would shorten it)")

    def _check_ice_servers(self) -> None:
        for url in self.ice_servers:
            if not re.fullmatch(r"(stuns?|turns?):[^\s/?#@]+(\?transport=(udp|tcp))?", url):
                raise ValueError(
                    f"ice_server {url!r}: use stun:HOST[:PORT] or turn:HOST[:PORT][?transport=udp|tcp] "
                    "(TURN credentials go in ice_username and ice_credential, never in the URL)"
                )

    def _check_resume_settings(self) -> None:
        if min(self.lease_seconds, self.resume_probe_seconds) <= 0:
            raise ValueError("lease_seconds and resume_probe_seconds must be positive")
        if min(self.awaiting_start_grace_seconds, self.awaiting_place_seconds) < 0:
            raise ValueError("awaiting_start_grace_seconds and awaiting_place_seconds must be >= 0")
        if not 0 <= self.resume_grace_seconds <= MAX_RESUME_GRACE_SECONDS:
            raise ValueError(f"resume_grace_seconds must be between 0 and {MAX_RESUME_GRACE_SECONDS:g}")
        if min(self.replay_buffer_bytes, self.watcher_buffer_bytes, self.session_store_bytes) < 1:
            raise ValueError("replay_buffer_bytes, watcher_buffer_bytes and session_store_bytes must be positive")
        if min(self.max_watchers_per_session, self.max_watchers, self.max_steerers_per_session, self.max_steerers) < 0:
            raise ValueError(
                "max_watchers_per_session, max_watchers, max_steerers_per_session, max_steerers must be >= 0"
            )

    def sessions_per_client(self, known_slots: int | None) -> int:
        """How many sessions one client address may hold: `max_sessions_per_client`, else half the
        model's slots (at least 1), so that one address never holds them all where there are two
        or more; 16 until every endpoint's capacity is known."""
        if self.max_sessions_per_client:
            return self.max_sessions_per_client
        return 16 if known_slots is None else max(1, known_slots // 2)

    def _check_broadcast_settings(self) -> None:
        if self.broadcast_window < 1 or self.broadcast_max_bytes < 1 or self.max_broadcasts < 0:
            raise ValueError("broadcast_window and broadcast_max_bytes must be positive, max_broadcasts >= 0")
        if self.broadcast_retention_seconds < 0:
            raise ValueError("broadcast_retention_seconds must be >= 0")
        base = self.broadcast_base_url
        if base is not None and not re.fullmatch(r"https?://[^\s?#]+", base):
            raise ValueError(f"--broadcast-base-url {base!r}: an http:// or https:// URL without a query")
        if base is not None and not self.broadcast_store:
            raise ValueError("--broadcast-base-url needs --broadcast-store (where the broadcasts are written)")

    @property
    def takeover_wait_seconds(self) -> float:
        """How long a resume at a replica that does not hold its session waits for the holder's
        lease: a lease and a margin, so that a dead holder's lease surely lapsed by then."""
        return self.lease_seconds + TAKEOVER_MARGIN_SECONDS

    @property
    def store_keep_seconds(self) -> float:
        """How long a shared store keeps a session's keys without a renewal: its resume grace, and
        the lease that may still have been running when its holder went."""
        return self.resume_grace_seconds + self.lease_seconds

    @property
    def recording_cap(self) -> int:
        """Bytes one recording may take (`recording_max_bytes`, else a quarter of the whole)."""
        return min(self.recording_max_bytes or max(1, self.recordings_max_bytes // 4), self.recordings_max_bytes)

    @property
    def awaiting_start_bound(self) -> int:
        """How many upgraded connections may wait for their session.start at once: a share of
        `max_connections`, so that connections that never start cannot take every slot."""
        share = self.max_awaiting_start or max(4, self.max_connections // 4)
        return min(share, self.max_connections)

    @property
    def awaiting_start_per_client(self) -> int:
        """How many of the waiting share one client (`client_group`) may hold: its part, so that
        one client's idle upgrades never take the places of another's; at least 2, so that a
        client that opens a second connection before it starts the first is not made to wait."""
        part = self.max_awaiting_start_per_client or max(2, self.awaiting_start_bound // 4)
        return min(part, self.awaiting_start_bound)

    def client_group(self, address: str) -> str:
        """The client `address` counts as for every per-client bound: its network of
        `address_prefix_v4` / `address_prefix_v6` bits (rtvideo.proxy.placement.addresses.client_group)."""
        return client_group(address, self.address_prefix_v4, self.address_prefix_v6)


def add_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add the proxy flags (except the settings named in `skip`) to `parser`."""
    settings_text.add_flags(parser, ProxySettings, skip=skip)


def from_namespace(ns: argparse.Namespace, **overrides: Any) -> ProxySettings:
    """Settings from parsed flags (see `add_arguments`), with explicit overrides on top."""
    return ProxySettings(**{**settings_text.values_from(ns, ProxySettings), **overrides})
