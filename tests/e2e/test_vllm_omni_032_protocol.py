"""A client written for vLLM-Omni 0.32.0rc1's `/v1/realtime/video` works unchanged, through the
real proxy and a real tritonserver, against both generators.

The client does what 0.32's endpoint asks of a paced client: `streaming_pacing` in its start
(`enabled`, `mode: "client_playhead"`, `max_lead_ms`), a `session.playback` report of its
playhead after each chunk, reading `output_chunk_index`, `pacing` and `coalesced_event_ids`
where present, and `stop_latency_s` after its `session.stop`.

- The built-in generator paces: each media chunk carries `output_chunk_index` and `pacing`,
  the lead over the reported playhead stays within `max_lead_ms`, and two prompts sent while
  generation waits for the player coalesce (the first is reported at the boundary where the
  second starts), as 0.32's prompt handler does.
- The vllm_omni generator (the stand-in for vLLM-Omni 0.30's engine, which cannot hold a
  request back) reports `streaming_pacing` in `config.ignored_fields` and streams unpaced;
  the client's reports are taken and never answered.

No timing asserts: the playhead bound is checked on what the chunks say, and the waits only
bound hangs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.omni_triton import MODEL as OMNI_MODEL
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.streams import PACED_MODEL, Transcript, check_stream_rules

#: what a 0.32 client sends (0.32's `StreamingPacingConfig`, as its docs show it)
PACING = {"enabled": True, "mode": "client_playhead", "max_lead_ms": 1000}


async def paced_client(url: str, *, chunks: int, coalesce_after: int | None) -> Transcript:
    """Start paced, report the playhead at the end of what arrived after each media chunk, and
    (when `coalesce_after`) send two prompts after that chunk before reporting; then stop."""
    async with ws(url) as conn:
        s = Ws(conn)
        await s.start("a harbour at dawn", seed=5, streaming_pacing=dict(PACING))
        played = 0.0
        fps = s.t.messages[0]["config"]["fps"]
        for index in range(chunks):
            meta = await s.next_media()
            played += meta["num_frames"] / fps
            if index == coalesce_after:
                await s.interact("a harbour in fog", "first", 0)
                await s.interact("a harbour at night", "second", 0)
                for event_id in ("first", "second"):
                    await s.until(
                        lambda m, e=event_id: m["type"] == "session.interaction.queued" and m["event_id"] == e
                    )
            await s.send({"type": "session.playback", "position_seconds": played})
        await s.send({"type": "session.stop"})
        return await s.finish()


def stopped_with_latency(t: Transcript) -> dict[str, Any]:
    done = t.messages[-1]
    assert done["type"] == "session.done" and done["stopped"] is True
    assert isinstance(done["stop_latency_s"], float) and done["stop_latency_s"] >= 0
    return done


def test_a_032_client_is_paced_by_the_built_in_generator(proxies) -> None:
    t = run(paced_client(proxies.url(model=PACED_MODEL), chunks=6, coalesce_after=1), 180)
    check_stream_rules(t)  # every message matched rtvideo/schemas/server_messages.json
    assert [m for m in t.messages if m["type"] == "error"] == []  # no report was answered
    config = t.messages[0]["config"]
    assert config["ignored_fields"] == [] and config["streaming_pacing"]["max_lead_ms"] == 1000.0
    for meta in t.media:
        assert meta["output_chunk_index"] == meta["generation_chunk_index"]
        assert meta["pacing"]["lead_seconds"] <= 1.0 + 1e-6  # within max_lead over the reported playhead
        assert meta["pacing"]["retained_bytes"] == meta["byte_length"]
    # 0.32's coalescing: "first" was pending when "second" came, so it is reported (under both
    # names) at the boundary where "second" starts, and never starts itself
    starts = [m for m in t.media if "second" in m["started_event_ids"]]
    assert len(starts) == 1 and starts[0]["coalesced_event_ids"] == ["first"]
    assert starts[0]["superseded_event_ids"] == ["first"]
    assert not any("first" in m["started_event_ids"] for m in t.media)
    assert all("coalesced_event_ids" not in m for m in t.media if m is not starts[0])
    # a paced session's acks carry 0.32's ingress stamp, in the order they arrived
    acks = {m["event_id"]: m for m in t.messages if m["type"] == "session.interaction.queued"}
    assert 0 < acks["first"]["received_at"] <= acks["second"]["received_at"]
    done = stopped_with_latency(t)
    assert done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []


def test_a_032_client_works_unchanged_against_the_vllm_omni_generator(omni) -> None:
    proxies, _engines = omni
    t = run(paced_client(proxies.url(model=OMNI_MODEL), chunks=4, coalesce_after=None), 180)
    check_stream_rules(t)
    assert [m for m in t.messages if m["type"] == "error"] == []
    config = t.messages[0]["config"]
    assert config["ignored_fields"] == ["streaming_pacing"]  # 0.30's engine cannot hold a request back
    assert "streaming_pacing" not in config
    assert all("pacing" not in m and "output_chunk_index" not in m for m in t.media)  # not paced
    stopped_with_latency(t)


def test_the_65th_waiting_interaction_is_interaction_queue_full_and_the_session_goes_on(proxies) -> None:
    """A paced session whose player does not report holds its next boundary; a client that keeps
    sending meanwhile gets 0.32's bound: 64 waiting events are acked, the 65th is refused by
    name, nothing of it recorded, and the video goes on once the player reports (the 63 older
    targets coalesce into the 64th, and a new interaction is acked again)."""

    async def body() -> Transcript:
        async with ws(proxies.url(model=PACED_MODEL)) as conn:
            s = Ws(conn)
            await s.start("a harbour", seed=3, streaming_pacing=dict(PACING))
            first = await s.next_media()
            for i in range(65):  # under the proxy's message rate (20 a second)
                await s.interact(f"harbour {i}", f"e{i}", 0)
                await asyncio.sleep(0.06)
            refused = await s.until(lambda m: m["type"] == "error", 60)
            assert refused["code"] == "interaction_queue_full" and refused["event_id"] == "e64", refused
            fps = s.t.messages[0]["config"]["fps"]
            await s.send({"type": "session.playback", "position_seconds": first["num_frames"] / fps})
            started = await s.until(lambda m: m["type"] == "video.chunk_metadata" and m["started_event_ids"], 60)
            assert started["started_event_ids"] == ["e63"]
            assert started["coalesced_event_ids"] == [f"e{i}" for i in range(63)]
            await s.interact("harbour again", "e64", 0)  # the refused one, sent again: now taken
            await s.until(lambda m: m["type"] == "session.interaction.queued" and m["event_id"] == "e64", 60)
            await s.send({"type": "session.stop"})
            return await s.finish()

    t = run(body(), 180)
    check_stream_rules(t)
    acked = [m["event_id"] for m in t.messages if m["type"] == "session.interaction.queued"]
    assert acked == [f"e{i}" for i in range(64)] + ["e64"]
    assert [m["code"] for m in t.messages if m["type"] == "error"] == ["interaction_queue_full"]
    stopped_with_latency(t)
