"""The approximate start of a session whose generator's state cannot be rebuilt (vLLM-Omni's
engine): a branch of such a recording, or such a live session moved to another Triton
(docs/recordings.md "vLLM-Omni sessions").

The built-in generator rebuilds chunk N exactly from the event log (rtvideo.core.rebuild). An
engine's latent state cannot be rebuilt, so the new session starts from what the viewer last
saw: the last frame before chunk N as its first frame (`image_reference`) and the prompt in
effect there (a transition in progress jumps to its target). Its `rebuild` carries no history
to replay: only N, so that generation chunk indices continue from N, and for a move the
session's own events `named` (a retry of one is acked, never applied again), those in progress
at the cut marked `open` (the new stream lists them completed in its first chunk). Camera
motion is not carried over: a camera command in progress ends at the cut.

Pure: decoded JSON in, a decoded `session.start` out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from rtvideo.core.rebuild import REBUILD, Rebuild, ScriptedEvent

PROMPT_FIELDS = ("prompt", "prompts")
#: a start's length, in frames or in seconds at the session's fps
LENGTH_FIELDS = ("num_frames", "seconds")


def prompt_in_effect(start: Mapping[str, Any], events: Iterable[ScriptedEvent], at: int) -> dict[str, Any]:
    """The start's prompt fields (`prompt` or `prompts`) as the last prompt-bearing event that
    started before chunk `at` left them (its target: a transition in progress is taken as done)."""
    fields = {name: start[name] for name in PROMPT_FIELDS if name in start}
    for event in events:
        if event.chunk >= at:
            continue
        sent: Mapping[str, Any] = event.request.event
        given = {name: sent[name] for name in PROMPT_FIELDS if name in sent}
        if given:
            fields = given
    return fields


def approximate_start(
    start: Mapping[str, Any],
    *,
    seed: int,
    at: int,
    events: Iterable[ScriptedEvent],
    image_url: str | None,
    frames_before: int,
    named: bool = False,
    open_ids: Collection[str] = (),
) -> dict[str, Any]:
    """The `session.start` that goes on at generation chunk `at` from the frame `image_url`
    (None: from the start's own, at chunk 0). `frames_before`: frames the stream had before
    `at`, carried in the rebuild (a bounded session keeps its remaining frames, `Starts._rebuilt`). `named`: the events are the session's
    own (a move), listed in `rebuild` with `open_ids` marked; else (a branch) none are sent."""
    events = tuple(events)
    fields = {k: v for k, v in start.items() if k not in (REBUILD, *PROMPT_FIELDS)}
    fields.update(prompt_in_effect(start, events, at))
    fields["seed"] = seed
    if image_url is not None:
        fields["image_reference"] = image_url
    own = tuple(replace(e, named=True, open=e.event_id in open_ids) for e in events if e.chunk < at) if named else ()
    # the length stays as the start gave it (`num_frames` or `seconds`): the model resolves it at
    # its own fps and takes these frames off, so either way the session plays what is left; a
    # start without a length is open-ended, and its new engine request gets the model's whole cap
    bounded = any(name in fields for name in LENGTH_FIELDS)
    fields[REBUILD] = Rebuild(at, own, frames_before if bounded else 0).to_json()
    return fields
