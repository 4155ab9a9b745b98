"""The Triton side of the proxy: one gRPC channel per server, one gRPC stream per session.

`TritonStream` is a `SessionStream` (rtvideo.proxy.placement.streams): fed from an asyncio.Queue of
requests (docs/protocol.md §8: one client message per request; `sequence_start` on the
start, `sequence_end` on the stop), it yields `Reply`s: the request they answer, the server
message, the payload. `TritonBridge.probe` is the health probe the supervisor sends (a
one-request sequence). Invariant: a sequence this proxy started is always ended on Triton,
by its stop, or by a call of its own after a cancel (bounded by `END_CALL_SECONDS`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, KeepAliveOptions
from tritonclient.grpc.aio import InferenceServerClient

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.observability import tracing
from rtvideo.proxy.tasks import TaskSet
from rtvideo.triton import wire
from rtvideo.triton.access import key_headers, new_session_secret, short_hash
from rtvideo.triton.wire import START_TAG, Reply

log = logging.getLogger(__name__)

#: the request bytes of a `session.ping` (forwarded pings, the health probe) and of a
#: `session.stop` (sent with `sequence_end` to end a sequence)
PING = server_messages.encode({"type": protocol.PING}).encode()
#: the health probe's ping: it asks for the model's status in the pong (docs/protocol.md §8)
PROBE = server_messages.encode({"type": protocol.PING, "status": True}).encode()
STOP = server_messages.encode({"type": protocol.STOP}).encode()
#: the proxy's keep-alive on a live session's sequence (docs/protocol.md §8): a `session.ping`
#: that keeps Triton's idle timeout off but is no progress for the model's stall clock
KEEPALIVE = server_messages.encode({"type": protocol.PING, "keepalive": True}).encode()
#: how long Triton may take to end a call once its sequence was ended and its requests
#: half-closed (it ends it when every request has completed: about a millisecond, or a chunk
#: when generation was still running), before the stream is cancelled
END_GRACE_SECONDS = 3.0
#: how long the call that ends a cancelled stream's sequence may take (bounded: Triton may be gone)
END_CALL_SECONDS = 10.0
#: the longest gRPC waits between attempts to reach a Triton that went away (its default backoff
#: grows to 120 s, so a server back after a restart went unnoticed for long); the connect
#: timeout, `min_reconnect_backoff_ms`, stays 20 s
RECONNECT_BACKOFF_MS = 1000


def channel_args() -> list[tuple[str, int]]:
    """tritonclient's own defaults (message sizes, keep-alive), and reconnect attempts at most
    `RECONNECT_BACKOFF_MS` apart."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]


class BackendUnavailable(Exception):
    """Triton is unreachable, refused a request, or the stream broke."""


class ProbeTimeout(BackendUnavailable):
    """The health probe got no answer in time: a wedged or dead model, or one whose sequence
    slots are all held (the probe waits in Triton's backlog); the supervisor asks the model's
    heartbeat which (rtvideo.proxy.placement.heartbeat)."""


def new_sequence_id() -> int:
    """A random non-zero 64-bit correlation id (docs/protocol.md §8)."""
    return secrets.randbelow(2**63 - 1) + 1


def _request_tensor(raw: bytes) -> InferInput:
    tensor = InferInput(wire.REQUEST, [1], "BYTES")
    tensor.set_data_from_numpy(wire.request_array(raw))
    return tensor


def triton_request(
    model: str,
    raw: bytes,
    tag: str,
    sequence_id: int,
    *,
    start: bool = False,
    end: bool = False,
    secret: str | None = None,
    traceparent: str | None = None,
) -> dict[str, Any]:
    """One client message as `stream_infer`'s request (docs/protocol.md §8). `secret`: the
    session's, carried by every request of its sequence (none for the health probe);
    `traceparent`: a traced session's (rtvideo.proxy.observability.tracing)."""
    return {
        "model_name": model,
        "inputs": [_request_tensor(raw)],
        "request_id": tag,
        "sequence_id": sequence_id,
        "sequence_start": start,
        "sequence_end": end,
        "parameters": wire.secret_parameters(secret, traceparent),
    }


class TritonStream:
    """One session's sequence on its own bidirectional gRPC stream."""

    def __init__(
        self, client: InferenceServerClient, model: str, endings: TaskSet, headers: dict[str, str] | None = None
    ) -> None:
        self._client = client
        self._model = model
        self._headers = headers or {}  # Triton's access key (rtvideo.triton.access), on every call
        self._endings = endings  # the bridge's: its close waits for them
        self.sequence_id = new_sequence_id()
        # the session's secret: only requests that carry it reach the session (docs/protocol.md §8)
        self._secret = new_session_secret()
        self._traceparent = tracing.current_traceparent()  # a traced session's (None: not traced)
        self._requests: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._count = 0
        self._call: Any = None
        self._cancelled = False
        self._open = False  # a start went out and no end: the sequence is live on Triton
        self.ending: asyncio.Task[Any] | None = None  # the call that ends it after a cancel

    def send(self, raw: bytes, *, start: bool = False, end: bool = False) -> str:
        """Queue one client message (sent verbatim); returns the tag its replies carry."""
        self._count += 1
        self._open = (self._open or start) and not end
        tag = START_TAG if start else f"m{self._count}"
        self._requests.put_nowait(
            triton_request(
                self._model,
                raw,
                tag,
                self.sequence_id,
                start=start,
                end=end,
                secret=self._secret,
                traceparent=self._traceparent,
            )
        )
        return tag

    async def _request_iterator(self) -> AsyncIterator[dict[str, Any]]:
        while (request := await self._requests.get()) is not None:
            yield request

    async def replies(self) -> AsyncGenerator[Reply, None]:
        """Responses in arrival order, until the stream ends; raises BackendUnavailable."""
        if self._cancelled:  # cancelled before it was read: nothing may reach Triton
            return
        try:
            # the traceparent as a header too: Triton's own traces (`--triton-trace`) join the session's
            headers = {**self._headers, "traceparent": self._traceparent} if self._traceparent else self._headers
            self._call = self._client.stream_infer(self._request_iterator(), headers=headers)
            async for result, error in self._call:
                if error is not None:
                    raise BackendUnavailable(f"Triton refused a request: {error}")
                yield _reply(result)
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
        except BackendUnavailable:
            raise
        except Exception as exc:
            if not self._cancelled:
                raise BackendUnavailable(f"Triton stream failed: {type(exc).__name__}: {exc}") from exc

    def close_requests(self) -> None:
        """Half-close: end the request iterator, so gRPC ends the client's side of the call;
        Triton then ends the call once every request sent has completed."""
        self._requests.put_nowait(None)

    def cancel(self) -> None:
        """End the stream now (the model sees `is_cancelled()` and frees the session). A
        cancelled call does not end its sequence (Triton's sequence batcher would hold the slot
        until its idle timeout), so a sequence left live is ended on a call of its own."""
        self._cancelled = True
        self._requests.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
            if self._open:
                self._open = False
                self.ending = self._endings.spawn(self._end_sequence())

    async def _end_sequence(self) -> None:
        call = self._client.stream_infer(
            _one(triton_request(self._model, STOP, "end", self.sequence_id, end=True, secret=self._secret)),
            headers=self._headers,
        )
        ended = False
        try:
            # a stop completes flags-only: the call just ends (an aio client sees no response)
            ended = await _ends(call, END_CALL_SECONDS)
        finally:
            if not ended:
                call.cancel()
                log.info(
                    "sequence=%s Triton did not take its end (down, or it ended otherwise)",
                    short_hash(self.sequence_id),
                )


async def _one(request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A call's requests: this one, then the half-close."""
    yield request


async def _ends(call: Any, timeout: float) -> bool:
    """Whether `call` ends, with no further response, within `timeout`."""
    try:
        await asyncio.wait_for(call.__anext__(), timeout)
    except StopAsyncIteration:
        return True
    except Exception:  # noqa: BLE001 - a timeout or a broken stream: the caller cancels it
        return False
    return False  # another response: not the probe's contract


def _reply(result: Any) -> Reply:
    reply = wire.parse_reply(
        result.get_response().id, result.as_numpy(wire.META), result.as_numpy(wire.DATA), time.perf_counter()
    )
    if reply.message is None:
        raise BackendUnavailable("a Triton response carried no META output")
    return reply


class TritonBridge:
    """The proxy's connection to Triton (created on the proxy's event loop at first use). `key`:
    Triton's access key; every call carries it (`headers`), health calls included."""

    def __init__(self, url: str, model: str, key: str | None = None) -> None:
        self.url = url
        self.model = model
        #: the gRPC metadata of every call to this Triton (rtvideo.triton.access.key_headers)
        self.headers = key_headers(key)
        self._client: InferenceServerClient | None = None
        self._endings = TaskSet()  # calls ending cancelled streams' sequences
        #: what the model said of itself in the last answered probe (`session.pong` `model`:
        #: its session limit, live sessions, real-time capacity); None until one is answered
        self.model_status: dict[str, Any] | None = None

    @property
    def client(self) -> InferenceServerClient:
        if self._client is None:
            self._client = InferenceServerClient(self.url, channel_args=channel_args())
        return self._client

    def open_stream(self, patience: float = 0.0) -> TritonStream:
        """`patience` is a pool's: one server has no other to wait for."""
        return TritonStream(self.client, self.model, self._endings, self.headers)

    async def readiness(self, timeout: float = 2.0) -> dict[str, bool]:
        """Server and model readiness as Triton reports them (False when unreachable)."""
        status = {"server_ready": False, "model_ready": False}
        try:
            status["server_ready"] = bool(
                await self.client.is_server_ready(headers=self.headers, client_timeout=timeout)
            )
            status["model_ready"] = bool(
                await self.client.is_model_ready(self.model, headers=self.headers, client_timeout=timeout)
            )
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            pass
        return status

    async def probe(self, timeout: float) -> float:
        """The health probe (docs/protocol.md §8): `session.ping` alone on a fresh sequence, with
        `sequence_start` and `sequence_end`; returns the round trip in seconds. Raises
        BackendUnavailable unless a `session.pong` comes back within `timeout`."""
        request = triton_request(self.model, PROBE, "probe", new_sequence_id(), start=True, end=True)

        t0 = time.perf_counter()
        call: Any = None
        ended = False
        try:
            call = self.client.stream_infer(_one(request), headers=self.headers)
            result, error = await asyncio.wait_for(call.__anext__(), timeout)
            latency = time.perf_counter() - t0
            # The call ends by itself after the final answer (its one request is complete and the
            # requests are half-closed); it is cancelled only when it does not: cancelled probe
            # calls pile up in Triton and keep it from unloading the model.
            ended = await _ends(call, max(0.1, timeout - latency))
        except asyncio.TimeoutError:
            raise ProbeTimeout(f"no answer to the health probe within {timeout:g} s") from None
        except StopAsyncIteration:
            raise BackendUnavailable("the health probe's stream ended without an answer") from None
        except Exception as exc:
            raise BackendUnavailable(f"health probe failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if call is not None and not ended:
                call.cancel()
        if error is not None:
            raise BackendUnavailable(f"health probe refused: {error}")
        try:
            reply = _reply(result)
        except ValueError as exc:  # not UTF-8, not JSON: it would have ended the probing for good
            raise BackendUnavailable(f"health probe answered with something that is not a message: {exc}") from None
        if reply.message is None or reply.message.get("type") != protocol.PONG:
            raise BackendUnavailable(f"health probe answered with {reply.text[:200]}")
        status = reply.message.get("model")
        self.model_status = status if isinstance(status, dict) else None
        return latency

    async def close(self) -> None:
        """Close the channel once the calls that end cancelled streams' sequences are over (each
        within END_CALL_SECONDS), so that no sequence is left held on a Triton that lives on."""
        await self._endings.wait()
        await self.reconnect()

    async def reconnect(self) -> None:
        """Drop the channel now; the next call opens a fresh one (see Supervisor._run)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
