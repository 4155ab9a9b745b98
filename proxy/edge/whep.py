"""The WHEP door (RFC 9725; docs/protocol.md §9.5): a WebRTC viewer of a live session.

`POST /v1/realtime/video/whep` with an SDP offer (`Content-Type: application/sdp`) and
`Authorization: Bearer <watch_token or steer_token>` answers 201 with the SDP answer and
`Location: /v1/realtime/video/whep/{resource_id}`; `DELETE` of that location ends the viewer.

Admission is the watch door's (rtvideo.proxy.edge.guest_doors), in the same order: the
`--token` rules first (here from `?token=` alone: the Authorization header carries the
viewer's own token), then a live session named by the token (403 otherwise), then room for
one more participant of the token's kind (503 with `Retry-After`). A watch token's viewer
is a watcher of its session and counts against `--max-watchers-per-session` and
`--max-watchers`; a steer token's is a guest steerer that sends nothing, and counts against
the steerers' bounds (so a revoked steering ends it, as it ends a steerer's WebSocket).
Then the offer: not an SDP with a video section, 400; no H.264 in it, 406.

With a shared session store, a token this replica does not know may name a session another
replica holds: the POST is forwarded there once (marked with `RELAYED_HEADER`), and its
answer passed back; the WebRTC media then flows between the holder and the viewer directly.
A resource id starts with its holder's id, so a DELETE that reaches another replica is
forwarded to the holder too.

Without aiortc installed (the `webrtc` extra) the door answers 501.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.web import RequestHandler

from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.edge.access import bearer, origin_allowed, token_ok
from rtvideo.proxy.edge.guest_doors import MOVING_REASON
from rtvideo.proxy.edge.relay import RELAYED_HEADER, Where, locate
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.participants import whep_viewer
from rtvideo.proxy.participants.whep_viewer import IceServers, OfferError, ViewerEnded, WhepViewer, WhepViewers
from rtvideo.proxy.store.base import StoreUnavailable

log = logging.getLogger(__name__)

WHEP_PATH = "/v1/realtime/video/whep"
WHEP_RESOURCE_PATH = WHEP_PATH + r"/([A-Za-z0-9_.-]{1,128})"
#: the largest SDP offer taken (browsers send a few kB)
MAX_OFFER_BYTES = 64 * 1024
#: how long a forwarded request to the holder may take
FORWARD_SECONDS = 15.0
#: token prefixes → the kind of participant a viewer is (rtvideo.proxy.participants.features)
_KINDS = {"wv1": "watch", "sv1": "steer"}


class _WhepBase(RequestHandler):
    def initialize(self, context: ProxyContext, viewers: WhepViewers) -> None:
        self.context = context
        self.viewers = viewers

    def prepare(self) -> None:
        """CORS for a player on another origin that `--allow-origin` lets in (and this server's
        own pages): the answer's Location must be readable there. (Set here, not in
        `set_default_headers`, which Tornado calls before `initialize`; `refuse` keeps them.)"""
        origin = self.request.headers.get("Origin")
        if origin is not None and self._origin_ok(origin):
            self.set_header("Access-Control-Allow-Origin", origin)
            self.set_header("Vary", "Origin")
            self.set_header("Access-Control-Expose-Headers", "Location, Retry-After")

    def _origin_ok(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)

    def options(self, *args: str) -> None:
        """The CORS preflight (and RFC 9725's OPTIONS): what a cross-origin player may send."""
        origin = self.request.headers.get("Origin")
        if origin is not None and not self._origin_ok(origin):
            self.set_status(403)
            return
        self.set_header("Access-Control-Allow-Methods", "POST, DELETE, OPTIONS")
        self.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
        self.set_header("Access-Control-Max-Age", "600")
        self.set_header("Accept-Post", "application/sdp")
        self.set_status(204)

    def refuse(self, status: int, reason: str, retry_after: str | None = None) -> None:
        self.clear_header("Content-Type")
        self.set_status(status)
        if retry_after is not None:
            self.set_header("Retry-After", retry_after)
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.finish(f"{status}: {reason}\n")

    def without_token(self) -> bool:
        """The `--token` rules (401, counted as the upgrades' refusals are; True: refused). Not
        `access.refused_without_token`, whose `send_error` would drop the CORS headers."""
        ctx = self.context
        if token_ok(self.request, ctx.settings.token):
            return False
        ctx.metrics.rejected.labels("unauthorized").inc()
        self.set_header("WWW-Authenticate", 'Bearer realm="rtvideo"')
        self.refuse(401, "the server's --token is required (?token=)")
        return True

    def foreign_origin(self) -> bool:
        """A browser page of an origin not allowed: 403 (True: refused)."""
        origin = self.request.headers.get("Origin")
        if origin is not None and not self._origin_ok(origin):
            self.refuse(403, "this origin may not use WHEP here (--allow-origin)")
            return True
        return False

    async def forward(self, holder_url: str, method: str, path: str, body: bytes | None) -> None:
        """Pass this request to the replica that holds the session, and its answer back."""
        ctx = self.context
        query = urllib.parse.urlencode({"token": ctx.settings.token}) if ctx.settings.token is not None else ""
        parts = urllib.parse.urlsplit(holder_url)
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))
        headers = {RELAYED_HEADER: "1"}
        for name in ("Authorization", "Content-Type"):
            if (value := self.request.headers.get(name)) is not None:
                headers[name] = value
        request = HTTPRequest(
            url, method=method, headers=headers, body=body, request_timeout=FORWARD_SECONDS, follow_redirects=False
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:
            log.info("whep: the session's proxy did not answer (%s)", exc)
            self.refuse(503, MOVING_REASON, "1")
            return
        if response.code == 599:  # no HTTP answer at all (connection refused, timeout)
            self.refuse(503, MOVING_REASON, "1")
            return
        self.set_status(response.code)
        for name in ("Content-Type", "Location", "Retry-After", "WWW-Authenticate"):
            if (value := response.headers.get(name)) is not None:
                self.set_header(name, value)
        self.finish(response.body or b"")


class WhepHandler(_WhepBase):
    """`POST /v1/realtime/video/whep`: a new viewer."""

    async def post(self) -> None:
        ctx = self.context
        if self.foreign_origin():
            return
        if not whep_viewer.available():
            self.refuse(501, "WHEP needs the webrtc extra (aiortc), which this server lacks")
            return
        if self.without_token():
            return
        token, kind, offer = self._credential_and_offer()
        if token is None or kind is None or offer is None:
            return
        book: Any = ctx.features.watch_tokens if kind == "watch" else ctx.features.steer_tokens
        try:
            session = book.find(token)
        except ResumeRefused as exc:
            if not await self._elsewhere(kind, token, exc, book):
                log.info("peer=%s whep (%s) refused: %s", self.request.remote_ip, kind, exc.message)
                self.refuse(403, f"Unknown or ended {kind} token")
            return
        if self._no_room(kind, session):
            return
        await self._admit(kind, session, offer, lambda: book.find(token))

    def _no_room(self, kind: str, session: Any) -> bool:
        """The session's (and proxy's) room for one more participant of `kind` (503; True: refused)."""
        doors = session.attachments
        why = doors.watch_refusal() if kind == "watch" else doors.steer_refusal()
        if why is None:
            return False
        log.info("peer=%s whep (%s) refused: %s", self.request.remote_ip, kind, why)
        self.refuse(503, f"No room for a viewer: {why}", "5")
        return True

    def _credential_and_offer(self) -> tuple[str | None, str | None, str | None]:
        """The viewer's token, its kind and the offer; Nones once refused (401, 415, 413, 400, 406)."""
        token = bearer(self.request)
        kind = _KINDS.get(token.split(".", 1)[0]) if token is not None else None
        if token is None or kind is None:
            self.set_header("WWW-Authenticate", 'Bearer realm="rtvideo"')
            self.refuse(401, "Authorization: Bearer <watch_token or steer_token> is required")
            return None, None, None
        content_type = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/sdp":
            self.refuse(415, "the offer must be Content-Type: application/sdp")
            return None, None, None
        if len(self.request.body) > MAX_OFFER_BYTES:
            self.refuse(413, f"an offer is at most {MAX_OFFER_BYTES} bytes")
            return None, None, None
        try:
            offer = self.request.body.decode("utf-8")
            whep_viewer.check_offer(offer)
        except UnicodeDecodeError:
            self.refuse(400, "the offer is not UTF-8")
            return None, None, None
        except OfferError as exc:
            self.refuse(exc.status, str(exc))
            return None, None, None
        return token, kind, offer

    async def _admit(self, kind: str, session: Any, offer: str, find: Callable[[], Any]) -> None:
        """Answer the offer, then attach the viewer to `session` if it still lives (`find`: the
        token's session now; ResumeRefused once it ended) and still has room."""
        ctx = self.context
        s = ctx.settings
        if len(self.viewers) >= s.max_watchers + s.max_steerers:  # offers still being answered count too
            self.refuse(503, "No room for a viewer: this server has as many WebRTC viewers as it takes", "5")
            return
        ice = IceServers(s.ice_servers, s.ice_username, s.ice_credential)
        viewer = WhepViewer(self.viewers, kind, ice, ctx.holder, s.whep_connect_seconds)
        self.viewers.add(viewer)
        try:
            answer = await viewer.answer(offer)
        except OfferError as exc:
            viewer.end("its offer was refused")
            await viewer.closed()  # its peer connection is gone before the refusal is
            self.refuse(exc.status, str(exc))
            return
        except ViewerEnded as exc:  # the proxy stopped while the answer was made
            log.info("peer=%s whep (%s) refused: %s", self.request.remote_ip, kind, exc)
            self.refuse(503, MOVING_REASON, "1")
            return
        except (ValueError, KeyError, IndexError, AssertionError) as exc:  # aiortc's refusal of what it cannot parse
            viewer.end("its offer could not be set")
            await viewer.closed()
            log.info("peer=%s whep offer refused by the WebRTC stack: %r", self.request.remote_ip, exc)
            self.refuse(400, f"the offer could not be taken: {exc}")
            return
        try:
            live = find() is session
        except ResumeRefused:
            live = False
        doors = session.attachments
        why = (doors.watch_refusal() if kind == "watch" else doors.steer_refusal()) if live else None
        if why is not None:  # filled by others while the answer was made
            viewer.end("no room once its answer was made")
            await viewer.closed()  # its peer connection is gone before the refusal is
            log.info("peer=%s whep (%s) refused: %s", self.request.remote_ip, kind, why)
            self.refuse(503, f"No room for a viewer: {why}", "5")
            return
        if not live:
            participant = None
        elif kind == "watch":
            participant = doors.attach_watcher(viewer.link)
        else:
            participant = doors.attach_steerer(viewer.link, str(self.request.remote_ip))
        if participant is None:  # the session ended (or filled up) while the answer was made
            viewer.end("the session ended before it joined")
            await viewer.closed()
            self.refuse(404, "the session has ended")
            return
        viewer.joined(participant.leave)
        log.info("peer=%s whep (%s) resource=%s joined", self.request.remote_ip, kind, viewer.resource_id)
        self.set_status(201)
        self.set_header("Content-Type", "application/sdp")
        self.set_header("Location", f"{WHEP_PATH}/{viewer.resource_id}")
        self.finish(answer)

    async def _elsewhere(self, kind: str, token: str, refused: ResumeRefused, book: Any) -> bool:
        """As the guest doors do: a token of this deployment this replica does not know may name
        a session held by another replica (the POST is forwarded there) or moving (503)."""
        ctx = self.context
        if not ctx.store.shared or token.split(".")[:2] != [book.prefix, book.instance]:
            return False
        try:
            s = ctx.settings
            found = await locate(ctx.store, kind, token, ctx.holder, s.resume_grace_seconds, s.lease_seconds)
        except StoreUnavailable as exc:
            log.error("a whep offer could not be looked up in the session store: %s", exc)
            self.refuse(503, "the session store is unreachable; retry", "1")
            return True
        if found.where is Where.NOWHERE or (found.where is Where.HERE and not refused.unknown):
            return False
        if found.where is Where.ELSEWHERE and found.url is not None:
            if self.request.headers.get(RELAYED_HEADER) or ctx.draining:
                self.refuse(503, MOVING_REASON, "1")
                return True
            await self.forward(found.url, "POST", WHEP_PATH, self.request.body)
            return True
        self.refuse(503, MOVING_REASON, "1")
        return True


class WhepResourceHandler(_WhepBase):
    """`DELETE /v1/realtime/video/whep/{resource_id}`: the viewer ends. The resource id is the
    capability (unguessable, as RFC 9725's resource URL is); `--token` rules apply as for the POST."""

    async def delete(self, resource_id: str) -> None:
        ctx = self.context
        if self.foreign_origin():
            return
        if self.without_token():
            return
        viewer = self.viewers.get(resource_id)
        if viewer is not None:
            viewer.end("its DELETE came")
            await viewer.closed()
            self.set_status(200)
            self.finish()
            return
        holder = resource_id.split(".", 1)[0]
        if ctx.store.shared and holder != ctx.holder and not self.request.headers.get(RELAYED_HEADER):
            try:
                url = await ctx.store.address(holder)
            except StoreUnavailable:
                url = None
            if url:
                await self.forward(url, "DELETE", f"{WHEP_PATH}/{resource_id}", None)
                return
        self.refuse(404, "no such viewer (ended already?)")

    async def patch(self, resource_id: str) -> None:
        """Trickle ICE and ICE restarts (optional in RFC 9725) are not offered: candidates are in
        the offer and the answer."""
        self.set_header("Allow", "DELETE, OPTIONS")
        self.refuse(405, "trickle ICE is not supported: send the candidates in the offer")


def whep_routes(context: ProxyContext, viewers: WhepViewers) -> list[tuple[str, type[RequestHandler], dict[str, Any]]]:
    args = {"context": context, "viewers": viewers}
    return [(WHEP_PATH, WhepHandler, args), (WHEP_RESOURCE_PATH, WhepResourceHandler, args)]
