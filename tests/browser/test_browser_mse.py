"""A real browser (headless Chromium) plays what the backend streamed through Media Source Extensions.

The payloads come from a real session over Triton (an interaction and a stop, so the
trailer is included); the page appends them one by one, as a live player would.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.browser import drive_page
from tests.support.streams import PACED_MODEL, Transcript

PAGE = """<!doctype html><html><body><video id="v" muted></video><pre id="out">pending</pre><script>
(async () => {
  const log = [];
  try {
    const info = await (await fetch('info.json')).json();
    const type = `video/mp4; codecs="${info.codec}"`;
    log.push({supported: MediaSource.isTypeSupported(type)});
    const ms = new MediaSource(), v = document.getElementById('v');
    v.src = URL.createObjectURL(ms);
    await new Promise(r => ms.addEventListener('sourceopen', r, {once: true}));
    const sb = ms.addSourceBuffer(type);
    for (let n = 0; n < info.count; n++) {
      const buf = await (await fetch('seg' + n)).arrayBuffer();
      await new Promise((resolve, reject) => {
        sb.addEventListener('updateend', resolve, {once: true});
        sb.addEventListener('error', () => reject(new Error('append error at ' + n)), {once: true});
        sb.appendBuffer(buf);
      });
      const b = sb.buffered;
      log.push({segment: n, ranges: b.length, start: b.length ? b.start(0) : null, end: b.length ? b.end(b.length - 1) : null});
    }
    ms.endOfStream();
    log.push({state: ms.readyState, error: v.error ? v.error.code : null, duration: ms.duration});
  } catch (e) { log.push({exception: String(e)}); }
  document.getElementById('out').textContent = JSON.stringify(log);
  document.title = 'done';
})();
</script></body></html>"""


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/index.html"


def test_chromium_plays_the_stream_through_mse(triton, tmp_path: Path) -> None:
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:
        t = Transcript()
        s.start("a lighthouse in a storm", seed=4)
        media = 0
        for reply in s.until("session.done", 60):
            t.add(reply.message, reply.data)
            if reply.message and reply.message.get("kind") == "media":
                media += 1
                if media == 1:
                    s.interact("a calm sea at noon", event_id="calm", transition_chunks=2)
                if media == 4:
                    s.stop()
    payloads = [data for _, data in t.pairs]
    assert t.pairs[-1][0]["kind"] == "trailer"
    init = payloads[0]
    at = init.find(b"avcC")
    codec = f"avc1.{init[at + 5]:02X}{init[at + 6]:02X}{init[at + 7]:02X}"
    for n, data in enumerate(payloads):
        (tmp_path / f"seg{n}").write_bytes(data)
    (tmp_path / "info.json").write_text(json.dumps({"codec": codec, "count": len(payloads)}))
    (tmp_path / "index.html").write_text(PAGE)
    server, url = serve(tmp_path)
    try:
        # Until the page says it is done, in real time: a dump after a virtual time budget caught
        # the page still appending on a loaded machine ("pending").
        text = drive_page(url, {"out": "document.getElementById('out').textContent"}, 120, done_title="done")["out"]
    finally:
        server.shutdown()
    assert text != "pending", "the page did not get done within 120 s"
    log = json.loads(text)
    assert log[0] == {"supported": True}, log
    seconds_per_chunk = 9 / 16
    played = 0.0
    for meta, entry in zip((m for m, _ in t.pairs), log[1:], strict=False):
        assert "exception" not in entry, log
        played += meta["num_frames"] / 16
        assert entry["ranges"] == 1 and entry["start"] == 0
        assert abs(entry["end"] - played) < 1e-3, (entry, played)  # each chunk plays as it arrives: no lag
    assert played >= 4 * seconds_per_chunk
    assert log[-1]["state"] == "ended" and log[-1]["error"] is None, log
