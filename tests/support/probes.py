"""What tests read or build that the product never needs (kept out of the product's API): views
of a part's bounded state, and an interaction built without a session's parse."""

from __future__ import annotations

from rtvideo.core.interaction.types import PROMPT, Interaction, PromptPart
from rtvideo.proxy.broadcasts.playlist import Listing
from rtvideo.proxy.observability.session_timing import PlayheadTiming
from rtvideo.proxy.participants.replay import ReplayBuffer
from rtvideo.proxy.placement.move_log import MoveLog
from rtvideo.proxy.recordings.store import RecordingStore
from rtvideo.proxy.session.upstream import Upstream


def keepalives_unanswered(upstream: Upstream) -> int:
    """Keep-alives and pauses the session's upstream sent whose pong has not come back."""
    return len(upstream._keepalive_tags)


def tracked(timing: PlayheadTiming) -> tuple[int, int]:
    """How many events' update times and first-chunk times the playhead timing holds (each bounded)."""
    return len(timing._sent_at), len(timing._starts)


def prompt_update(event_id: str, prompt: str, chunks: int, received_at: float = 0.0) -> Interaction:
    """A prompt-only event with its N resolved, as a session admits it after its parse."""
    return Interaction(event_id, {"prompt": prompt}, (PromptPart(prompt),), {PROMPT: chunks}, chunks, received_at)


def oldest_resumable(buffer: ReplayBuffer) -> int:
    """The smallest `last_transport_chunk_index` a resume can be given (-1: from the start)."""
    return buffer._evicted_through


def kept_bytes(log: MoveLog) -> int:
    """The canonical size of the event payloads a move log keeps (within its `max_bytes`)."""
    return log._bytes


def room_for_new(store: RecordingStore) -> bool:
    """Whether a new recording may begin now (what `RecordingStore.reserve` checks, reserving nothing)."""
    with store._lock:
        return store._room(1)


def next_sequence(listing: Listing) -> int:
    """The media sequence number the playlist's next segment would have."""
    return listing.segments[-1].sequence + 1 if listing.segments else 0
