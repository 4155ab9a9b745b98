"""The Python client's camera events and first frame, against a scripted `websockets` server: what
goes on the wire is what the protocol says (docs/protocol.md §2.1, §5.1), and a camera event is
acked like a prompt update."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from rtvideo.client.session import RealtimeVideoClient, camera_payload, image_data_url
from rtvideo.core import protocol, start_request


def test_camera_events_and_an_image_reference_go_out_as_the_protocol_says(tmp_path: Path) -> None:
    picture = tmp_path / "first.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    received: list[dict[str, Any]] = []

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            message = json.loads(frame)
            received.append(message)
            if message["type"] == "session.start":
                await ws.send(json.dumps({"type": "video.start", "request_id": "r"}))
            elif message["type"] == "session.interaction":
                # the server's own parser accepts what the client sent
                protocol.parse_message(frame)
                event_id = message["interaction"]["event_id"]
                await ws.send(
                    json.dumps({"type": "session.interaction.queued", "request_id": "r", "event_id": event_id})
                )

    async def main() -> list[dict[str, Any]]:
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with RealtimeVideoClient(f"ws://127.0.0.1:{port}") as client:
                await client.start("x", image_reference={"image_url": image_data_url(picture)})
                forward = camera_payload("velocity", (0.0, 0.0, 0.05))
                acks = [await client.camera(forward, event_id="cam-1")]
                home = camera_payload("target", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0))
                acks.append(await client.interact("y", event_id="both-1", camera=home))
                return acks

    acks = asyncio.run(main())
    assert [a["event_id"] for a in acks] == ["cam-1", "both-1"]
    start, camera, both = received
    url = start["image_reference"]["image_url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == picture.read_bytes()
    assert start_request.validate_start(start).image_reference == url
    assert camera["interaction"]["event"] == {
        "multi_modal_data": {
            "camera": {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0, 0, 0, 1]}}
        }
    }
    assert both["interaction"]["event"]["prompt"] == "y"
    assert both["interaction"]["event"]["multi_modal_data"]["camera"]["mode"] == "target"


def test_image_data_url_refuses_other_files(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("not an image")
    with pytest.raises(ValueError, match="not a PNG, JPEG or WebP"):
        image_data_url(other)
    jpeg = tmp_path / "a.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 8)
    assert image_data_url(jpeg).startswith("data:image/jpeg;base64,")
