"""The admission of a door a token opens (`/watch`, `/steer`; docs/protocol.md §9.2-9.3), once:
the `--token` rules first, then a live session named by the query's token (403 otherwise),
then room for one more participant there (503 with `Retry-After` otherwise)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tornado.web import RequestHandler

from rtvideo.proxy.edge.access import refused_without_token
from rtvideo.proxy.participants.tokens import ResumeRefused, TokenBook

log = logging.getLogger(__name__)

T = TypeVar("T")


def admit(
    handler: RequestHandler,
    *,
    bearer: str | None,
    rejected: Callable[[str], None],
    book: TokenBook[T],
    kind: str,
    refusal: Callable[[T], str | None],
    no_room: Callable[[str], str],
) -> T | None:
    """The session `?{kind}_token=` opens, with room for one more; None once the request was
    refused (`refusal`: why the session takes no one now; `no_room`: the 503's reason for it)."""
    if refused_without_token(handler, bearer, rejected):
        return None
    values = handler.request.query_arguments.get(f"{kind}_token") or [b""]
    try:
        session = book.find(values[-1].decode("utf-8", "replace"))
    except ResumeRefused as exc:
        log.info("peer=%s %s refused: %s", handler.request.remote_ip, kind, exc.message)
        handler.send_error(403, reason=f"Unknown or ended {kind} token")
        return None
    why = refusal(session)
    if why is not None:
        log.info("peer=%s %s refused: %s", handler.request.remote_ip, kind, why)
        handler.set_header("Retry-After", "5")
        handler.send_error(503, reason=no_room(why))
        return None
    return session
