"""A session belongs to the stream that started it (docs/protocol.md §8, docs/security.md), on a
real tritonserver: a client on another stream that knows a live session's correlation id, but
not its secret, cannot inject an interaction, stop, replace or ping it; correlation ids,
secrets and prompts never reach the INFO logs of the model and the proxy."""

from __future__ import annotations

import json
import logging
import queue
import random
import time
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.proxy.placement import bridge as bridge_module
from rtvideo.triton import wire
from rtvideo.triton.access import key_from_env, key_headers, short_hash
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import FAST_MODEL, Transcript, check_stream_rules

PARAMETER = "rtvideo_session_secret"  # spelled out: the contract, not the code's constant
NOT_YOURS = {"type": "error", "code": "invalid_message", "message": "this request does not belong to the session"}
WRONG_SECRETS = {"no secret": None, "a wrong secret": "not-the-owner-s-secret-0123456789"}


class Stranger:
    """Another client on a stream of its own, sending raw requests on any correlation id, with
    the secret it chooses (or none). `request` returns one request's responses (None for a
    flags-only FINAL) up to its FINAL."""

    def __init__(self, url: str) -> None:
        self._replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._client = grpcclient.InferenceServerClient(url)
        self._client.start_stream(
            callback=lambda result, error: self._replies.put((result, error)), headers=key_headers(key_from_env())
        )
        self._count = 0

    def request(
        self,
        sequence_id: int,
        message: dict[str, Any],
        *,
        secret: str | None,
        start: bool = False,
        end: bool = False,
    ) -> list[dict[str, Any] | None]:
        self._count += 1
        tag = f"s{self._count}"
        tensor = grpcclient.InferInput(wire.REQUEST, [1], "BYTES")
        tensor.set_data_from_numpy(wire.request_array(message))
        self._client.async_stream_infer(
            FAST_MODEL,
            [tensor],
            request_id=tag,
            sequence_id=sequence_id,
            sequence_start=start,
            sequence_end=end,
            enable_empty_final_response=True,
            parameters={PARAMETER: secret} if secret is not None else None,
        )
        got: list[dict[str, Any] | None] = []
        while True:
            result, error = self._replies.get(timeout=20)
            assert error is None, error
            response = result.get_response()
            assert response.id == tag, f"a response of another request on the stranger's stream: {response.id}"
            got.append(wire.parse_reply(tag, result.as_numpy(wire.META), result.as_numpy(wire.DATA)).message)
            if response.parameters["triton_final_response"].bool_param:
                return got

    def close(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        self._client.close()

    def __enter__(self) -> Stranger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Owner:
    """The owner's side of a session: its stream's replies sorted into the session's messages
    (the start request's) and the answers to the owner's own later requests."""

    def __init__(self, session: TritonStreamSession) -> None:
        self.session = session
        self.t = Transcript()

    def media(self, count: int = 1) -> None:
        """Read until `count` more media chunks arrived, failing on a premature end."""
        seen = 0
        while seen < count:
            reply = self.session.next(30)
            self._record(reply)
            assert reply.message is not None and reply.message["type"] != "session.done", self.t.messages[-3:]
            seen += reply.message["type"] == "video.chunk_metadata" and reply.message["kind"] == "media"

    def answer(self, tag: str) -> dict[str, Any]:
        """The one answer to the owner's request `tag` (the session's messages on the way are kept)."""
        while True:
            reply = self.session.next(30)
            if reply.tag == tag:
                assert reply.message is not None
                self.t.add(reply.message, reply.data)
                return reply.message
            self._record(reply)

    def finish(self) -> Transcript:
        for reply in self.session.until("session.done", 60):
            self._record(reply)
        return self.t

    def _record(self, reply: Any) -> None:
        assert reply.tag == "r1", f"an answer to a request the test did not wait for: {reply}"
        self.t.add(reply.message, reply.data)


def _interaction(event_id: str, prompt: str) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": prompt}}}


def _named_events(t: Transcript) -> set[str]:
    """Every event id the session's stream names (chunk lists, session.done's lists, acks)."""
    named: set[str] = set()
    for message in t.messages:
        for key, value in message.items():
            if isinstance(value, list):
                named.update(v for v in value if isinstance(v, str))
            elif key == "event_id" and isinstance(value, str):
                named.add(value)
    return named


def _fresh_id() -> int:
    return random.randint(1, 2**62)


def test_a_stranger_cannot_inject_stop_replace_or_ping_a_session(triton) -> None:
    wait_idle(triton)
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as session, Stranger(triton.grpc_url) as stranger:
        owner = Owner(session)
        session.start("the owner's harbour", seed=5)
        owner.media()
        request_id = owner.t.messages[0]["request_id"]
        victim = session.sequence_id
        for how, secret in WRONG_SECRETS.items():
            injected = stranger.request(victim, _interaction(f"injected-{how}", "a stranger's prompt"), secret=secret)
            assert injected == [NOT_YOURS], (how, injected)
            assert stranger.request(victim, {"type": "session.ping"}, secret=secret) == [NOT_YOURS], how
            # a stop without sequence_end: Triton keeps the sequence, the model must keep the session
            assert stranger.request(victim, {"type": "session.stop"}, secret=secret) == [NOT_YOURS], how
            replaced = stranger.request(
                victim, {"type": "session.start", "prompt": "mine now"}, secret=secret, start=True
            )
            assert [m and m["type"] for m in replaced] == ["error", "session.done"], (how, replaced)
            assert replaced[0] is not None and replaced[0]["code"] == "invalid_start", replaced
            assert request_id not in json.dumps(replaced), "a refusal names the victim's session"
            owner.media(2)  # the session plays on
        # the owner's own requests still work
        assert owner.answer(session.send({"type": "session.ping"})) == {"type": "session.pong"}
        ack = owner.answer(session.interact("the owner's own update", event_id="mine"))
        assert ack == {"type": "session.interaction.queued", "request_id": request_id, "event_id": "mine"}
        owner.media(5)  # N = 3: the owner's event starts and completes
        session.stop()  # completes flags-only: the end arrives on the start request
        t = owner.finish()
    check_stream_rules(t)
    done = t.messages[-1]
    assert done["type"] == "session.done" and done["stopped"] is True, done
    named = _named_events(t)
    assert "mine" in named, "the owner's interaction was applied"
    assert not [e for e in named if e.startswith("injected")], f"a stranger's interaction reached the session: {named}"
    assert t.messages[0]["request_id"] == request_id and all(
        m.get("request_id", request_id) == request_id for m in t.messages
    )
    wait_idle(triton)


def test_a_stranger_s_sequence_end_does_not_stop_the_session_in_the_model(triton) -> None:
    """A request with `sequence_end` ends the sequence in Triton's batcher whoever sends it (only
    the Triton key keeps strangers out of that): the model still refuses to stop the session for
    it, so the owner's stream plays on (its later requests are refused by Triton itself)."""
    wait_idle(triton)
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as session, Stranger(triton.grpc_url) as stranger:
        owner = Owner(session)
        session.start("the owner's lighthouse", seed=6)
        owner.media()
        answered = stranger.request(session.sequence_id, {"type": "session.stop"}, secret=None, end=True)
        assert answered == [NOT_YOURS], answered
        owner.media(3)  # no trailer, no session.done: the session was not stopped
        assert not owner.t.of_type("session.done")
        session.cancel()  # its sequence is gone from Triton: the model frees the session on the cancel
    wait_idle(triton)


def test_a_start_needs_a_secret_and_the_probe_none(triton) -> None:
    with Stranger(triton.grpc_url) as client:
        sequence_id = _fresh_id()
        start = {"type": "session.start", "prompt": "no secret", "num_frames": 9}
        for secret in (None, "short"):
            refused = client.request(sequence_id, start, secret=secret, start=True)
            assert [m and m["type"] for m in refused] == ["error", "session.done"], refused
            assert refused[0] is not None and refused[0]["code"] == "invalid_start"
            assert PARAMETER in refused[0]["message"], refused[0]
        assert client.request(sequence_id, {"type": "session.stop"}, secret=None, end=True) == [None]
        probe = client.request(_fresh_id(), {"type": "session.ping"}, secret=None, start=True, end=True)
        assert probe == [{"type": "session.pong"}]
        # a start with a secret plays, and its stop needs the same secret
        sequence_id, secret = _fresh_id(), "a-secret-of-enough-characters"
        played = client.request(sequence_id, start, secret=secret, start=True)
        assert played[0] is not None and played[0]["type"] == "video.start" and played[-1] is not None
        assert played[-1]["type"] == "session.done" and played[-1]["stopped"] is False
        assert client.request(sequence_id, {"type": "session.stop"}, secret=secret, end=True) == [None]


def test_logs_show_hashes_not_correlation_ids_secrets_or_prompts(
    triton, proxies, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session through the real proxy and Triton, both logging at INFO: neither the
    correlation id, the secret nor the prompts appear; the correlation id's short hash does."""
    streams: list[Any] = []  # the proxy's session streams: their correlation ids and secrets
    opened = bridge_module.TritonStream.__init__

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        opened(self, *args, **kwargs)
        streams.append(self)

    monkeypatch.setattr(bridge_module.TritonStream, "__init__", recorded)
    caplog.set_level(logging.INFO)
    log_path = triton.log.path
    assert log_path is not None
    offset = log_path.stat().st_size
    prompt, update = "a secretive lighthouse at dusk", "a confidential snowy street"
    server = proxies.server()

    async def body() -> Transcript:
        async with ws(server.url) as conn:
            s = Ws(conn)
            await s.start(prompt, num_frames=45, seed=3)
            await s.next_media()
            await s.interact(update, "u1")
            return await s.finish()

    t = run(body())
    assert "u1" in _named_events(t)
    [stream] = streams
    sequence_id, secret = stream.sequence_id, stream._secret
    assert len(secret) >= 16
    deadline = time.monotonic() + 10
    model_log = ""
    while short_hash(sequence_id) not in model_log and time.monotonic() < deadline:
        model_log = log_path.read_bytes()[offset:].decode("utf-8", "replace")
        time.sleep(0.1)
    proxy_log = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    assert short_hash(sequence_id) in model_log, model_log[-3000:]
    assert f"{len(prompt)} chars, {short_hash(prompt)}" in model_log, "INFO gives the prompt's length and hash"
    for where, text in (("the model's log", model_log), ("the proxy's log", proxy_log)):
        for what, value in (
            ("correlation id", str(sequence_id)),
            ("secret", secret),
            ("prompt", prompt),
            ("update", update),
        ):
            assert value not in text, f"{where} shows the {what}: {text[-3000:]}"
