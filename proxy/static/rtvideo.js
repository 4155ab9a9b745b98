// rtvideo.js: a small browser client for rtvideo's WebSocket /v1/realtime/video.
// An ES module with no dependencies and no build step; the proxy serves it at /rtvideo.js.
// The protocol is docs/protocol.md in the rtvideo repository.
//
//   import { RealtimeVideoClient, MsePlayer } from "/rtvideo.js";
//   const client = new RealtimeVideoClient(RealtimeVideoClient.urlFor(location), { token });
//   const player = new MsePlayer(document.querySelector("video")).attach(client);
//   await client.connect();
//   client.start("a red lighthouse at sunset", { width: 256, height: 256, seed: 7 });
//   const { eventId, ackMs } = await client.interact("a snowy forest at night", { transitionChunks: 3 });
//   client.stop();
//
// Events (client.on(type, fn) calls fn with the detail; they are also DOM CustomEvents):
//   open, close {code, reason, clean}, message (every JSON message), video.start, chunk {meta, data},
//   queued {eventId, ackMs, attempts}, interaction (an event's record changed), shared (another participant's
//   update, its new record), error, pong, done, reconnecting {attempt, of, rejoin}, rejoined (a watch or steer
//   link opened again: its video.start), rejoin_failed, skipped {from, to} (transport indexes a rejoined link
//   never received), broadcast_ended; MsePlayer: ended, error, shown, jump {from, to}; WhepViewer: playing, lost {why}.
//
// Integers beyond 2^53 (a seed: 0 – 2^63−1) are parsed as BigInt, exactly (parseJson), and a
// BigInt field is sent as a JSON integer (stringifyJson): a seed shown is the seed in use.

/** The default codec string: H.264 Constrained Baseline, level 3.0. */
export const DEFAULT_CODEC = "avc1.42C01E";

/** The ends an acked event reaches (docs/protocol.md §5), plus "failed" for an error naming it. */
export const EVENT_ENDS = ["completed", "superseded", "interrupted", "failed", "unapplied", "unfinished"];

// --- exact integers: seeds run to 2^63−1, JavaScript numbers hold integers exactly to 2^53 ----
// A server message is parsed so that an integer beyond Number.MAX_SAFE_INTEGER (in practice a
// seed, video.start config.seed) becomes a BigInt with every digit; a safe one stays a Number.
// A BigInt in a client message goes out as a JSON integer, digit for digit.
const BIG = "\u0000rtvideo-bigint:"; // a sentinel no server string starts with
const TOKENS = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g; // strings first: digits inside them are left alone

/** JSON.parse, with integers beyond 2^53 as BigInt (exact), e.g. a 64-bit seed. */
export function parseJson(text) {
  if (!/\d{16}/.test(text)) return JSON.parse(text); // no integer long enough to be unsafe
  const quoted = text.replace(TOKENS, t => (t[0] !== '"' && /^-?\d+$/.test(t) && !Number.isSafeInteger(Number(t)) ? `"\\u0000rtvideo-bigint:${t}"` : t));
  return JSON.parse(quoted, (key, value) => (typeof value === "string" && value.startsWith(BIG) ? BigInt(value.slice(BIG.length)) : value));
}

/** JSON.stringify, with BigInt values written as JSON integers (exact). */
export function stringifyJson(value) {
  const text = JSON.stringify(value, (key, v) => (typeof v === "bigint" ? `${BIG}${v}` : v));
  return text.replace(/"\\u0000rtvideo-bigint:(-?\d+)"/g, "$1");
}

/** A seed as typed or shown ("9193305143676202691"): a Number when it is exact as one, else a
 * BigInt; null for anything but a plain non-negative integer. */
export function seedFrom(text) {
  const digits = String(text ?? "").trim();
  if (!/^\d{1,19}$/.test(digits)) return null;
  const n = Number(digits);
  return Number.isSafeInteger(n) ? n : BigInt(digits);
}

// Camera keys, as vLLM-Omni's streaming example maps them (Unity axes: +X right, +Y up, +Z forward):
// W/S move 0.05 forward/back, D/A 0.05 right/left, I/K turn 4 degrees about +X, L/J 6 degrees about +Y;
// the per-frame deltas of a "velocity" camera event.
export const CAMERA_STEP = 0.05;
export const CAMERA_PITCH_DEGREES = 4.0;
export const CAMERA_YAW_DEGREES = 6.0;
export const CAMERA_KEYS = ["w", "a", "s", "d", "i", "j", "k", "l"];

function axisAngle(axis, degrees) {
  const half = (degrees * Math.PI) / 360;
  const s = Math.sin(half);
  return [axis[0] * s, axis[1] * s, axis[2] * s, Math.cos(half)];
}

function quatMul([ax, ay, az, aw], [bx, by, bz, bw]) {
  return [
    aw * bx + ax * bw + ay * bz - az * by,
    aw * by - ax * bz + ay * bw + az * bx,
    aw * bz + ax * by - ay * bx + az * bw,
    aw * bw - ax * bx - ay * by - az * bz,
  ];
}

/** The camera payload of the held keys (any of CAMERA_KEYS): a per-frame velocity, yaw then pitch. */
export function cameraFromKeys(keys, mode = "velocity") {
  const held = new Set([...keys].map(k => String(k).toLowerCase()));
  const on = k => (held.has(k) ? 1 : 0);
  const translation = [CAMERA_STEP * (on("d") - on("a")), 0, CAMERA_STEP * (on("w") - on("s"))];
  const yaw = CAMERA_YAW_DEGREES * (on("l") - on("j"));
  const pitch = CAMERA_PITCH_DEGREES * (on("i") - on("k"));
  let rotation = yaw ? axisAngle([0, 1, 0], yaw) : [0, 0, 0, 1];
  if (pitch) rotation = quatMul(axisAngle([1, 0, 0], pitch), rotation);
  return { mode, data: { translation, rotation } };
}

/** A "target" back to the start pose: the camera returns to the start view. */
export const CAMERA_HOME = Object.freeze({ mode: "target", data: { translation: [0, 0, 0], rotation: [0, 0, 0, 1] } });
/** A velocity of zero: the camera stops where it is. */
export const CAMERA_HOLD = Object.freeze({ mode: "velocity", data: { translation: [0, 0, 0], rotation: [0, 0, 0, 1] } });

/** A short label for a camera payload (the demo's timeline). */
export function describeCamera(camera) {
  const t = camera.data.translation.map(v => v.toFixed(2)).join(", ");
  const r = camera.data.rotation.map(v => v.toFixed(3)).join(", ");
  return `camera ${camera.mode} t=[${t}] q=[${r}]`;
}

/** A fresh event id ("evt-" + a UUID unless another prefix is given). */
export function newEventId(prefix = "evt") {
  if (globalThis.crypto && crypto.randomUUID) return `${prefix}-${crypto.randomUUID()}`;
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 12)}`;
}

/** "avc1.PPCCLL" from the avcC box of an init segment, or null when there is none. */
export function codecFromInit(bytes) {
  for (let i = 4; i + 8 < bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) {
      const hex = b => b.toString(16).toUpperCase().padStart(2, "0");
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`;
    }
  }
  return null;
}

class Emitter extends EventTarget {
  /** Call `fn(detail)` for every event of `type`; returns a function that unsubscribes. */
  on(type, fn) {
    const listener = ev => fn(ev.detail);
    this.addEventListener(type, listener);
    return () => this.removeEventListener(type, listener);
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

/**
 * One session over one WebSocket. Tracks every prompt update from send to its end:
 * `client.interactions` maps event ids to records
 * {eventId, prompt, transitionChunks, state, sentAt, attempts, ackMs, startedChunk, progress, end, endChunk, error,
 * shownMs (send → its first chunk on screen, set by an attached MsePlayer), from (null: this client's own; "owner" or
 * "steerer": another participant's, from session.interaction.shared)} where state is "sent", "queued", "active" or the end
 * (EVENT_ENDS).
 */
export class RealtimeVideoClient extends Emitter {
  /** ws(s)://<page's host and folder>/v1/realtime/video, with ?token= when given. */
  static urlFor(location, token = null) {
    const base = String(location.href).replace(/[?#].*$/, "").replace(/[^/]*$/, "");
    const url = new URL("v1/realtime/video", base);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (token) url.searchParams.set("token", token);
    return url.href;
  }

  /**
   * @param {string} url  the WebSocket URL (see urlFor)
   * @param {object} options  token (added as ?token=), retryMs (resend an unacked update after this
   *   long, default 1000), maxAttempts (sends per update before giving up, default 5),
   *   storeRetryMs (how long an update refused store_unavailable is sent again, default 10000),
   *   rejoinSeconds (how long a dropped watch or steer link is opened again, default 10)
   */
  constructor(url, { token = null, retryMs = 1000, maxAttempts = 5, storeRetryMs = 10000, resumeAttempts = 5, resumeBackoffMs = 250, rejoinSeconds = 10 } = {}) {
    super();
    this._initResume(resumeAttempts, resumeBackoffMs);
    this.rejoinSeconds = rejoinSeconds;
    const target = new URL(url, globalThis.location ? globalThis.location.href : undefined);
    if (token) target.searchParams.set("token", token);
    this.url = target.href;
    this.retryMs = retryMs;
    this.maxAttempts = maxAttempts;
    this.storeRetryMs = storeRetryMs;
    this.ws = null;
    this.requestId = null;
    this.config = null;
    this.done = null;
    this.stopped = false;
    this.interactions = new Map();
    this._pending = new Map(); // eventId -> {resolve, reject, timer}
    this._meta = null;
  }

  get isOpen() {
    return !!this.ws && this.ws.readyState === WebSocket.OPEN;
  }

  /** Opens the WebSocket; resolves when it is open. */
  connect() {
    if (this.ws) throw new Error("already connected");
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let opened = false;
      ws.onopen = () => { opened = true; this.emit("open", {}); resolve(this); };
      ws.onerror = () => { if (!opened) reject(new Error(`cannot connect to ${this.url}`)); };
      ws.onmessage = ev => this._onFrame(ev.data);
      ws.onclose = ev => this._onClose(ev);
    });
  }

  /** session.start: `fields` are any other session.start fields (width, height, fps, seed, num_frames, ...). */
  start(prompt, fields = {}) {
    // prompt null: a blend start (`fields.prompts`, [{text, weight}, ...], and `fields.interpolation`)
    const message = prompt === null || prompt === undefined ? { type: "session.start", format: "m4s" } : { type: "session.start", prompt, format: "m4s" };
    for (const [key, value] of Object.entries(fields)) if (value !== null && value !== undefined && value !== "") message[key] = value;
    this._send(message);
    return message;
  }

  /**
   * A prompt update. Resolves with {eventId, ackMs, attempts} on its session.interaction.queued;
   * rejects with an Error (its .code, .eventId) when an error names it or no ack came after
   * maxAttempts sends. The same payload is resent with the same event_id every retryMs until then
   * (the server answers a retry with the same ack and never applies it twice). One refused
   * store_unavailable (replicas whose shared session store stalls: it was not applied) goes on being
   * resent every retryMs, past maxAttempts, for up to storeRetryMs from the first refusal; then it
   * rejects with that error.
   */
  interact(prompt, { eventId = null, transitionChunks = null, event = null, interpolation = null } = {}) {
    const id = eventId || newEventId();
    // prompt null: an event of other modalities only (`event.multi_modal_data`, e.g. a camera move)
    const interaction = { event_id: id, event: prompt === null || prompt === undefined ? { ...(event || {}) } : { ...(event || {}), prompt } };
    if (transitionChunks !== null && transitionChunks !== undefined && transitionChunks !== "") {
      interaction.transition_chunks = Number(transitionChunks);
    }
    if (interpolation) interaction.interpolation = interpolation;
    const message = { type: "session.interaction", interaction };
    const payload = JSON.stringify([interaction.event, interaction.transition_chunks ?? null, interaction.interpolation ?? null]);
    const known = this.interactions.get(id);
    if (known && known.payload !== payload) {
      // The server refuses a reuse of an id with another payload (event_id_conflict) and keeps the original.
      if (known.ackMs === null) {
        return Promise.reject(Object.assign(new Error(`${id} is in flight with another payload`), { code: "event_id_conflict", eventId: id }));
      }
      return this._expect(id, () => this._send(message));
    }
    if (known && this._pending.has(id)) return this._pending.get(id).promise;
    if (known && known.ackMs !== null) {
      return Promise.resolve({ eventId: id, ackMs: known.ackMs, attempts: known.attempts }); // acked already
    }
    const record = {
      eventId: id, prompt: prompt ?? null, prompts: interaction.event.prompts ?? null,
      interpolation: interaction.interpolation ?? null, camera: interaction.event.multi_modal_data?.camera ?? null,
      transitionChunks: interaction.transition_chunks ?? null, state: "sent", payload,
      sentAt: performance.now(), attempts: 0, ackMs: null, startedChunk: null, progress: 0, end: null,
      endChunk: null, error: null, shownMs: null, from: null,
    };
    this.interactions.set(id, record);
    const attempt = () => {
      const pending = this._pending.get(id);
      if (!pending) return;
      if (this.reconnecting) { pending.timer = setTimeout(attempt, this.retryMs); return; } // sent once resumed
      const storeRetrying = record.storeRefusedAt != null && performance.now() - record.storeRefusedAt <= this.storeRetryMs;
      if ((record.attempts >= this.maxAttempts && !storeRetrying) || !this.isOpen) {
        const error = Object.assign(new Error(this.isOpen ? `no ack for ${id} after ${record.attempts} sends` : "the connection is closed"), { code: "no_ack", eventId: id });
        this._fail(id, error);
        return;
      }
      record.attempts += 1;
      this._send(message);
      pending.timer = setTimeout(attempt, this.retryMs);
    };
    const promise = this._expect(id, attempt);
    this.emit("interaction", record);
    return promise;
  }

  /**
   * A camera event (`event.multi_modal_data.camera`, docs/protocol.md): `camera` is
   * {mode: "velocity"|"target", data: {translation: [x, y, z], rotation: [x, y, z, w]}}, e.g. from
   * cameraFromKeys() or CAMERA_HOME. Acked, retried and tracked like a prompt update; with `prompt`
   * the same event also changes the prompt.
   */
  camera(camera, { prompt = null, eventId = null, transitionChunks = null } = {}) {
    return this.interact(prompt, { eventId: eventId || newEventId("cam"), transitionChunks, event: { multi_modal_data: { camera } } });
  }

  /**
   * A weighted prompt blend (`event.prompts`, docs/protocol.md §2.2): `prompts` is 2-8
   * [{text, weight}] (weights > 0, normalised by the server); `interpolation` "linear" or "slerp"
   * (null: the session's default). Acked, retried and tracked like a prompt update; a generator
   * without blends (video.start config.interactions) answers the ack with interaction_failed.
   */
  blend(prompts, { interpolation = null, eventId = null, transitionChunks = null } = {}) {
    const event = { prompts: prompts.map((p) => ({ text: p.text, weight: Number(p.weight) })) };
    return this.interact(null, { eventId: eventId || newEventId("blend"), transitionChunks, event, interpolation });
  }

  /** A pending answer about `id`; `send` sends (and may reschedule itself through the timer). */
  _expect(id, send) {
    let settle;
    const promise = new Promise((resolve, reject) => { settle = { resolve, reject }; });
    this._pending.set(id, { ...settle, promise, timer: null });
    try { send(); } catch (e) { this._reject(id, Object.assign(e, { code: e.code || "not_open", eventId: id })); }
    return promise;
  }

  stop() {
    if (this.stopped) return;
    this.stopped = true;
    this._send({ type: "session.stop" });
  }

  ping() {
    this._send({ type: "session.ping" });
  }

  /** The owner ends the session's HLS broadcast, the session going on (docs/protocol.md
   * "Broadcasts"); answered by "broadcast_ended". */
  endBroadcast() {
    this._send({ type: "session.broadcast", enabled: false });
  }

  /** The owner ends every steer link and retires the steer token for good (docs/protocol.md §9.3);
   * answered by "steering_revoked" {revoked}. */
  revokeSteering() {
    this._send({ type: "session.revoke_steering" });
  }

  /**
   * A playhead report (session.playback, docs/protocol.md §2.6): the media time shown now and,
   * optionally, the seconds buffered beyond it. MsePlayer sends these itself (its reportMs).
   * Never answered while within the rate; the server paces the stream to it.
   */
  playback(positionSeconds, bufferedSeconds = null) {
    const message = { type: "session.playback", position_seconds: Math.max(0, +positionSeconds || 0) };
    if (bufferedSeconds !== null && bufferedSeconds !== undefined) message.buffered_seconds = Math.max(0, +bufferedSeconds || 0);
    this._send(message);
  }

  close(code = 1000) {
    this._closing = true; // our own close: nothing to resume
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(code);
  }

  _send(message) {
    if (!this.isOpen) throw new Error("the WebSocket is not open");
    this.ws.send(stringifyJson(message));
  }

  _update(id, changes) {
    const record = this.interactions.get(id);
    if (!record || record.end) return;
    Object.assign(record, changes);
    if (changes.end) record.state = changes.end;
    this.emit("interaction", record);
  }

  _reject(id, error) {
    const pending = this._pending.get(id);
    if (!pending) return;
    clearTimeout(pending.timer);
    this._pending.delete(id);
    pending.promise.catch(() => {}); // callers that do not await still see the interaction event
    pending.reject(error);
  }

  _fail(id, error) {
    this._reject(id, error);
    this._update(id, { end: "failed", error: error.code || String(error) });
  }

  _onFrame(data) {
    if (typeof data !== "string") {
      const meta = this._meta;
      this._meta = null;
      if (meta && !this._fresh(meta)) return; // an init pair after payloads, or a payload received already
      this.emit("chunk", { meta, data: new Uint8Array(data) });
      return;
    }
    let m;
    try { m = parseJson(data); } catch (e) { this.emit("error", { code: "client_invalid_json", message: String(e) }); return; }
    this.emit("message", m);
    this._lastError = m.type === "error"; // a close right after an error is the server's word: no rejoin
    switch (m.type) {
      case "video.start":
        if (this._rejoinStart) { this._rejoinStart = false; this.emit("rejoined", m); break; } // the same watch goes on
        this.resumeToken = m.resume_token || null;
        this.watchToken = m.watch_token || this.watchToken;
        this.watcher = m.watcher === true;
        this.steerToken = m.steer_token || (m.resumed ? this.steerToken : null);
        this.steerer = m.steerer === true;
        if (m.resumed) { this.emit("resumed", m); break; } // the same session goes on
        this.requestId = m.request_id;
        this.config = m.config;
        this.emit("video.start", m);
        break;
      case "session.interaction.queued": {
        const pending = this._pending.get(m.event_id);
        const record = this.interactions.get(m.event_id);
        if (!pending || (record && record.ackMs !== null)) break; // a duplicate ack (of a retry): already reported
        clearTimeout(pending.timer);
        this._pending.delete(m.event_id);
        const ackMs = record ? performance.now() - record.sentAt : null;
        if (record && record.state === "sent") this._update(m.event_id, { state: "queued", ackMs });
        const detail = { eventId: m.event_id, ackMs, attempts: record ? record.attempts : 1 };
        pending.resolve(detail);
        this.emit("queued", detail);
        break;
      }
      case "video.chunk_metadata":
        this._meta = m;
        this._track(m);
        break;
      case "error": {
        const record = m.event_id ? this.interactions.get(m.event_id) : null;
        const error = Object.assign(new Error(m.message || m.code), { code: m.code, eventId: m.event_id });
        if (record && m.code === "event_id_conflict" && record.state !== "sent") {
          this._reject(m.event_id, error); // a reuse of the id with another payload: the original goes on
        } else if (record && m.code === "store_unavailable" && this._pending.has(m.event_id)) {
          // never applied: its retry timer sends it again with the same id, within storeRetryMs
          record.storeRefusedAt ??= performance.now();
          if (performance.now() - record.storeRefusedAt > this.storeRetryMs) this._fail(m.event_id, error);
        } else if (record) {
          this._fail(m.event_id, error);
        }
        this.emit("error", m);
        break;
      }
      case "session.done":
        this.done = m;
        for (const id of m.unapplied_event_ids || []) this._update(id, { end: "unapplied" });
        for (const id of m.unfinished_event_ids || []) this._update(id, { end: "unfinished" });
        this.emit("done", m);
        break;
      case "session.pong":
        this.emit("pong", m);
        break;
      case "session.interaction.shared": // another participant's update, acked to it (docs/protocol.md §9.4)
        this._shared(m);
        break;
      case "session.broadcast_ended": // the answer to endBroadcast(), or the proxy's own end of it
        this.emit("broadcast_ended", m);
        break;
      case "session.steering_revoked": // the answer to revokeSteering()
        this.steerToken = null;
        this.emit("steering_revoked", m);
        break;
      case "session.metrics": // only when the start asked with "metrics": true (docs/protocol.md §3.5)
        this.emit("metrics", m);
        break;
      default:
        break;
    }
  }

  /** A record for an update another participant sent (`from`: "owner" or "steerer"), followed
   * through the chunk lists like this client's own; its `ackMs` and `sentAt` stay null. */
  _shared(m) {
    const interaction = m.interaction || {};
    const id = m.event_id;
    if (!id || this.interactions.has(id)) return;
    const event = interaction.event || {};
    const record = {
      eventId: id, prompt: event.prompt ?? null, prompts: event.prompts ?? null, interpolation: interaction.interpolation ?? null,
      camera: event.multi_modal_data?.camera ?? null, transitionChunks: interaction.transition_chunks ?? null,
      state: "queued", payload: null, sentAt: null, attempts: 0, ackMs: null, startedChunk: null, progress: 0, end: null,
      endChunk: null, error: null, shownMs: null, from: m.from || "steerer",
    };
    this.interactions.set(id, record);
    this.emit("shared", record);
    this.emit("interaction", record);
  }

  _track(m) {
    const chunk = m.generation_chunk_index;
    for (const id of m.started_event_ids || []) this._update(id, { state: "active", startedChunk: chunk });
    for (const [id, progress] of Object.entries(m.transition_progress || {})) this._update(id, { progress });
    for (const id of m.completed_event_ids || []) this._update(id, { end: "completed", endChunk: chunk, progress: 1 });
    for (const id of m.superseded_event_ids || []) this._update(id, { end: "superseded", endChunk: chunk });
    for (const id of m.interrupted_event_ids || []) this._update(id, { end: "interrupted", endChunk: chunk });
  }

  // --- resume after a dropped connection (docs/protocol.md §9.1) --------------------------------
  _initResume(attempts, backoffMs) {
    this.resumeAttempts = attempts;
    this.resumeBackoffMs = backoffMs;
    this.resumeToken = null; // from video.start when the start asked for "resumable": true
    this.watchToken = null; // when it asked for "watchable": true
    this.watcher = false; // a watch connection (read-only)
    this.steerToken = null; // when it asked for "steerable": true, until revoked (§9.3)
    this.steerer = false; // a steer connection (not the owner: it cannot stop the session)
    this.lastIndex = -1; // transport index of the last payload received whole
    this.reconnecting = false;
    this.resumes = 0;
    this.rejoins = 0; // watch or steer links opened again after a drop
    this.skipped = []; // [{from, to}]: transport indexes never received (a rejoin goes on from the live edge)
    this._rejoinStart = false; // the next video.start is a rejoined link's
    this._lastError = false;
    this._closing = false;
  }

  /** ws(s)://…/v1/realtime/video/watch?watch_token=… for a session's watch token. */
  static watchUrlFor(location, watchToken, token = null) {
    const url = new URL(RealtimeVideoClient.urlFor(location, token));
    url.pathname = url.pathname.replace(/\/?$/, "/watch");
    url.searchParams.set("watch_token", watchToken);
    return url.href;
  }

  /** ws(s)://…/v1/realtime/video/steer?steer_token=… for a session's steer token (a closed link
   * with code 4001: the owner revoked steering). */
  static steerUrlFor(location, steerToken, token = null) {
    const url = new URL(RealtimeVideoClient.urlFor(location, token));
    url.pathname = url.pathname.replace(/\/?$/, "/steer");
    url.searchParams.set("steer_token", steerToken);
    return url.href;
  }

  /** Whether a payload is handed out: an init pair only as the very first (a watcher's start), a
   * media or trailer payload only once; records the index for a resume. */
  _fresh(meta) {
    const index = meta.transport_chunk_index;
    if (meta.kind === "init" || index === null || index === undefined) {
      const first = !this._hadPayload;
      this._hadPayload = true;
      return first;
    }
    if (index <= this.lastIndex) return false;
    if (this.lastIndex >= 0 && index > this.lastIndex + 1) { // a rejoin lands at the live edge: what it missed is said
      this.skipped.push({ from: this.lastIndex + 1, to: index - 1 });
      this.emit("skipped", { from: this.lastIndex + 1, to: index - 1 });
    }
    this.lastIndex = index;
    this._hadPayload = true;
    return true;
  }

  /** The connection dropped before session.done: resume with backoff, bounded; false when resume does not apply. */
  _resumeAfter(ev) {
    if (this.done || !this.resumeToken || this._closing || ev.code === 1000 || this.resumeAttempts <= 0) return false;
    this._meta = null;
    this.reconnecting = true;
    const giveUp = (why, error = null) => {
      this.reconnecting = false;
      if (error) this.emit("error", error);
      this.emit("resume_failed", { why, attempts: this.resumeAttempts });
      this._closed(ev);
    };
    const attempt = n => {
      if (n >= this.resumeAttempts) { giveUp(`no resume after ${n} attempts`); return; }
      this.emit("reconnecting", { attempt: n + 1, of: this.resumeAttempts });
      setTimeout(() => {
        const ws = new WebSocket(this.url);
        ws.binaryType = "arraybuffer";
        let answered = false;
        ws.onopen = () => ws.send(JSON.stringify({ type: "session.resume", resume_token: this.resumeToken, last_transport_chunk_index: this.lastIndex }));
        ws.onmessage = first => {
          if (answered) return;
          answered = true;
          let m = null;
          try { m = parseJson(first.data); } catch (e) { /* not an answer */ }
          if (m && m.type === "video.start" && m.resumed) {
            this.ws = ws;
            this.reconnecting = false;
            this.resumes += 1;
            ws.onmessage = e => this._onFrame(e.data);
            ws.onclose = e => this._onClose(e);
            this._onFrame(first.data);
            return;
          }
          ws.onclose = null;
          ws.close();
          if (m && m.type === "error" && /attached/.test(m.message || "")) attempt(n + 1); // the old one is not seen gone yet
          else giveUp(m ? m.message : "no answer to session.resume", m);
        };
        ws.onclose = () => { if (!answered) attempt(n + 1); };
      }, this.resumeBackoffMs * 2 ** n);
    };
    attempt(0);
    return true;
  }

  /** A watch or steer link that closed before session.done, and not for a reason the server gave
   * (a revoke or refusal: 4xxx; an error written just before a close), is opened again with the same
   * token, waiting 0.1 s, 0.2 s … up to 1 s between tries, for up to rejoinSeconds: its proxy
   * restarted, its session moved to another replica, or the relay to it went (a refused open, such as
   * the 503 of a session on its way to another proxy, is tried again). The rejoined link's video.start
   * is "rejoined", not "video.start"; its init pair and pairs received already are not handed out. */
  _rejoinAfter(ev) {
    if (this.done || this._closing || !(this.watcher || this.steerer)) return false;
    if ((ev.code >= 4000 && ev.code < 5000) || (ev.code === 1000 && this._lastError)) return false;
    this._meta = null;
    this.reconnecting = true;
    const deadline = performance.now() + this.rejoinSeconds * 1000;
    let tries = 0;
    const attempt = waitMs => {
      if (this._closing || performance.now() + waitMs > deadline) {
        this.reconnecting = false;
        if (!this._closing) this.emit("rejoin_failed", { why: `no link after ${tries} tries`, attempts: tries });
        this._closed(ev);
        return;
      }
      tries += 1;
      this.emit("reconnecting", { attempt: tries, of: `${this.rejoinSeconds} s`, rejoin: true });
      setTimeout(() => {
        const ws = new WebSocket(this.url);
        ws.binaryType = "arraybuffer";
        ws.onopen = () => {
          if (this._closing) { ws.onclose = null; ws.close(1000); this._closed(ev); return; }
          this.ws = ws;
          this.reconnecting = false;
          this.rejoins += 1;
          this._lastError = false;
          this._rejoinStart = true;
          ws.onmessage = e => this._onFrame(e.data);
          ws.onclose = e => this._onClose(e);
        };
        ws.onclose = () => attempt(Math.min(waitMs * 2, 1000));
      }, waitMs);
    };
    attempt(100);
    return true;
  }

  _onClose(ev) {
    if (this._resumeAfter(ev)) return;
    if (this._rejoinAfter(ev)) return;
    this._closed(ev);
  }

  _closed(ev) {
    for (const id of [...this._pending.keys()]) {
      const error = Object.assign(new Error("the connection closed before an answer"), { code: "closed", eventId: id });
      const record = this.interactions.get(id);
      if (record && record.ackMs !== null) this._reject(id, error); // acked: its end comes below
      else this._fail(id, error);
    }
    if (!this.done) { // no session.done: what the client saw is all it will know
      for (const record of this.interactions.values()) {
        if (!record.end) this._update(record.eventId, { end: record.startedChunk === null ? "unapplied" : "unfinished", error: "closed" });
      }
    }
    this.emit("close", { code: ev.code, reason: ev.reason, clean: ev.wasClean });
  }
}

/**
 * Plays a session's fMP4 payloads in a <video> through Media Source Extensions, in order, and
 * keeps what was played so it can be saved. The trailer (an mfra index) is kept for the
 * recording but not appended: a SourceBuffer has no use for it.
 */
export class MsePlayer extends Emitter {
  /**
   * @param {HTMLVideoElement} video
   * @param {object} options  codec (default: read from the init segment, else DEFAULT_CODEC),
   *   record (keep payloads for save(), default true), recordLimitBytes (default 512 MiB),
   *   keepSeconds (buffered media kept behind the playhead, default 60), reportMs (send the
   *   client a session.playback report this often once attached, default 250; 0: never, and the
   *   server paces to its fixed lead as without reports; only an owner's connection reports: a
   *   watcher's or steerer's playhead paces nothing), maxLagSeconds (a live player further behind
   *   the end of what it holds than this jumps forward, default 2.5; 0: never), liveLagSeconds
   *   (how far behind the end such a jump lands, default 0.4)
   *
   * Live edge: a player that joins a stream mid-way (a watcher, a steerer) holds media that
   * starts seconds in, and a <video> does not jump a gap at the start (nor one in the middle)
   * by itself: it would show black. So the player seeks into what it holds, and after a stall
   * that left it more than maxLagSeconds behind, it seeks to liveLagSeconds behind the end.
   */
  constructor(video, { codec = null, record = true, recordLimitBytes = 512 * 1024 * 1024, keepSeconds = 60, reportMs = 250,
    maxLagSeconds = 2.5, liveLagSeconds = 0.4 } = {}) {
    super();
    this.reportMs = reportMs;
    this.maxLagSeconds = maxLagSeconds;
    this.liveLagSeconds = liveLagSeconds;
    this.jumps = 0; // seeks made to reach (or catch up with) the live edge
    this._liveTimer = null;
    this._reportTimer = null;
    this._mediaSeconds = 0; // media received so far: the next chunk's start on the timeline
    this._toShow = []; // [{eventId, start}]: updates whose first chunk is not on screen yet
    this.video = video;
    this.codec = codec;
    this.type = null;
    this.record = record;
    this.recordLimitBytes = recordLimitBytes;
    this.keepSeconds = keepSeconds;
    this.payloads = [];
    this.recordedBytes = 0;
    this.recordTruncated = false;
    this.appended = 0;
    this.error = null;
    this.ended = false;
    this._queue = [];
    this._ending = false;
    this._sb = null;
    this.mediaSource = new MediaSource();
    this._url = URL.createObjectURL(this.mediaSource);
    video.src = this._url;
    this.mediaSource.addEventListener("sourceopen", () => {
      URL.revokeObjectURL(this._url); // attached: the URL is no longer needed
      this._pump();
    }, { once: true });
  }

  /** Feed it a client's chunks; ends the stream on session.done or when the connection closes. */
  attach(client) {
    client.on("chunk", ({ meta, data }) => { this._noteStarts(client, meta); this.push(data, meta); });
    client.on("done", () => { this._stopReports(); this.end(); });
    client.on("close", () => { this._stopReports(); this.end(); });
    client.on("video.start", () => { if (!client.watcher && !client.steerer) this._startReports(client); });
    this._liveTimer = setInterval(() => this.followLive(), 250);
    this._watchShown(client);
    return this;
  }

  // --- on screen: playhead reports and each update's send → shown ---------------------------
  _startReports(client) {
    if (!this.reportMs || this._reportTimer) return;
    this._reportTimer = setInterval(() => {
      if (!client.isOpen || client.stopped || client.done) { this._stopReports(); return; }
      try { client.playback(this.video.currentTime, this.lead); } catch (e) { this._stopReports(); }
    }, this.reportMs);
  }

  _stopReports() {
    clearInterval(this._reportTimer);
    this._reportTimer = null;
  }

  /** Keep the playhead in what is buffered and near its end (see the constructor); returns
   * whether it seeked. Called on every append and four times a second until the stream ends. */
  followLive() {
    const video = this.video;
    if (this.ended && this._liveTimer) { clearInterval(this._liveTimer); this._liveTimer = null; }
    if (!this._sb || video.seeking || this.error) return false;
    let ranges;
    try { ranges = this._sb.buffered; } catch (e) { return false; }
    if (!ranges.length) return false;
    const now = video.currentTime;
    const end = ranges.end(ranges.length - 1);
    let inside = false;
    for (let i = 0; i < ranges.length; i++) if (now >= ranges.start(i) && now < ranges.end(i)) inside = true;
    let target = null;
    if (!inside && now < end) { // before the first range (a mid-stream join) or in a gap: into the next range
      for (let i = 0; i < ranges.length && target === null; i++) if (ranges.start(i) > now) target = ranges.start(i);
      if (target !== null && this.maxLagSeconds > 0 && end - target > this.maxLagSeconds) target = end - this.liveLagSeconds;
    } else if (inside && this.maxLagSeconds > 0 && end - now > this.maxLagSeconds && !this._ending) {
      target = end - this.liveLagSeconds; // fell behind (a stall, a throttled tab): back to the live edge
    }
    if (target === null) return false;
    video.currentTime = target + 1e-3; // just inside the range: a seek to its exact start may land before it
    this.jumps += 1;
    if (video.paused) video.play().catch(() => {});
    this.emit("jump", { from: now, to: target });
    return true;
  }

  /** Each media chunk's start on the timeline (frames so far / fps); an update's first chunk
   * (started_event_ids) is where it shows. */
  _noteStarts(client, meta) {
    if (!meta || meta.kind !== "media") return;
    const fps = client.config && client.config.fps;
    for (const id of meta.started_event_ids || []) this._toShow.push({ eventId: id, start: this._mediaSeconds });
    if (fps) this._mediaSeconds += meta.num_frames / fps;
  }

  /** When the video shows an update's first frame, its record gets shownMs (send → on screen)
   * and the player emits "shown" {eventId, shownMs}. Frames are watched with
   * requestVideoFrameCallback where the browser has it (the frame's own presentation time),
   * else currentTime is polled. */
  _watchShown(client) {
    const video = this.video;
    const check = (mediaTime, at) => {
      if (!this._toShow.length) return;
      const left = [];
      for (const item of this._toShow) {
        if (mediaTime + 1e-3 >= item.start) {
          const record = client.interactions.get(item.eventId);
          if (record && record.shownMs == null && record.sentAt !== null) { // not another participant's
            const shownMs = at - record.sentAt;
            client._update(item.eventId, { shownMs });
            if (record.end && record.shownMs == null) record.shownMs = shownMs; // ended already: kept anyway
            this.emit("shown", { eventId: item.eventId, shownMs });
          }
        } else left.push(item);
      }
      this._toShow = left;
    };
    if (typeof video.requestVideoFrameCallback === "function") {
      this.frameClock = "requestVideoFrameCallback";
      const onFrame = (now, frame) => {
        check(frame.mediaTime, frame.expectedDisplayTime || now);
        if (!this.ended || this._toShow.length) video.requestVideoFrameCallback(onFrame);
      };
      video.requestVideoFrameCallback(onFrame);
    } else {
      this.frameClock = "currentTime";
      const timer = setInterval(() => {
        check(video.currentTime, performance.now());
        if (this.ended && !this._toShow.length) clearInterval(timer);
      }, 15);
    }
  }

  /** Queue one payload (Uint8Array or ArrayBuffer) with its chunk metadata. */
  push(data, meta = null) {
    const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
    if (this.record && !this.recordTruncated) {
      if (this.recordedBytes + bytes.length > this.recordLimitBytes) this.recordTruncated = true;
      else { this.payloads.push(bytes); this.recordedBytes += bytes.length; }
    }
    if (meta && meta.kind === "trailer") return;
    if (!this.type) {
      this.codec = this.codec || codecFromInit(bytes) || DEFAULT_CODEC;
      this.type = `video/mp4; codecs="${this.codec}"`;
      if (!MediaSource.isTypeSupported(this.type)) this._error("unsupported_type", `this browser cannot play ${this.type}`);
    }
    this._queue.push(bytes);
    this._pump();
  }

  /** End of stream once every queued payload has been appended ("ended" fires after the current
   * event's other listeners, e.g. a page's own session.done handler, have run). */
  end() {
    this._ending = true;
    queueMicrotask(() => this._pump());
  }

  /** Seconds of media buffered (the end of the last buffered range). */
  get bufferedEnd() {
    try {
      const b = this._sb ? this._sb.buffered : this.video.buffered;
      return b.length ? b.end(b.length - 1) : 0;
    } catch (e) {
      return 0; // the SourceBuffer was detached (the video element moved on to another stream)
    }
  }

  /** How far the stream runs ahead of playback: buffered end minus the playhead, in seconds. */
  get lead() {
    return Math.max(0, this.bufferedEnd - this.video.currentTime);
  }

  /** What was received so far, as one fragmented MP4 (trailer included once the session ended). */
  recording() {
    return new Blob(this.payloads, { type: "video/mp4" });
  }

  /** Offer the recording as a download; returns its size in bytes. */
  save(filename = "rtvideo.mp4") {
    const blob = this.recording();
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    return blob.size;
  }

  _error(code, message) {
    if (this.error) return;
    this.error = code;
    this.emit("error", { code, message });
    this._pump();
  }

  _pump() {
    const ms = this.mediaSource;
    if (this._ending && !this.type && !this._queue.length) {
      this._finish(); // nothing was ever received
      return;
    }
    if (!this._sb && this.type && ms.readyState === "open" && !this.error) {
      try {
        this._sb = ms.addSourceBuffer(this.type);
        this._sb.mode = "segments";
        this._sb.addEventListener("updateend", () => { this.followLive(); this._pump(); });
        this._sb.addEventListener("error", () => this._error("append_error", "the browser could not append a payload"));
      } catch (e) {
        this._error("unsupported_type", `cannot play ${this.type}: ${e}`);
        return;
      }
    }
    const sb = this._sb;
    if (!sb || sb.updating || this.error) {
      if (this.error) this._finish();
      return;
    }
    const now = this.video.currentTime;
    if (sb.buffered.length && now - sb.buffered.start(0) > this.keepSeconds + 10) {
      sb.remove(0, now - this.keepSeconds); // long sessions: drop what was played long ago
      return;
    }
    if (this._queue.length) {
      const bytes = this._queue.shift();
      try {
        sb.appendBuffer(bytes);
        this.appended += 1;
        if (this.video.paused) this.video.play().catch(() => {});
      } catch (e) {
        if (e.name === "QuotaExceededError" && now > 1) {
          this._queue.unshift(bytes);
          sb.remove(0, Math.max(0.1, now - 1));
        } else {
          this._error("append_error", `append failed: ${e}`);
        }
      }
      return;
    }
    if (this._ending) this._finish();
  }

  _finish() {
    if (this.ended) return;
    if (this._sb && this._sb.updating) return;
    this.ended = true;
    if (this.mediaSource.readyState === "open" && !this.error) {
      try { this.mediaSource.endOfStream(); } catch (e) { /* already ended */ }
    }
    this.emit("ended", { bufferedEnd: this.bufferedEnd, error: this.error || (this.video.error ? this.video.error.code : null) });
  }
}


/**
 * The picture of a session over WebRTC (WHEP, RFC 9725; docs/protocol.md §9.5) in a <video>:
 * one receive-only H.264 track, passed through by the proxy without encoding again. Only the
 * picture: metadata, acks and the timeline stay on the WebSocket (a RealtimeVideoClient), so a
 * page that shows this keeps its client and an MsePlayer for everything else (and to fall back to).
 *
 *   const viewer = new WhepViewer(video, WhepViewer.urlFor(location, token), watchOrSteerToken);
 *   await viewer.open();           // rejects (its .status) when the proxy refuses the offer
 *   viewer.on("playing", () => …); // the first frame is on screen
 *   viewer.on("lost", ({ why }) => …);
 *   viewer.close();                // DELETE of the resource: the viewer leaves
 */
export class WhepViewer extends Emitter {
  /** http(s)://<page's host and folder>/v1/realtime/video/whep, with ?token= when given. */
  static urlFor(location, token = null) {
    const base = String(location.href).replace(/[?#].*$/, "").replace(/[^/]*$/, "");
    const url = new URL("v1/realtime/video/whep", base);
    if (token) url.searchParams.set("token", token);
    return url.href;
  }

  /** Whether this browser has WebRTC at all. */
  static get supported() {
    return typeof globalThis.RTCPeerConnection === "function";
  }

  /**
   * @param {HTMLVideoElement} video  where the track plays
   * @param {string} endpoint  the WHEP URL (urlFor)
   * @param {string} bearer  a watch token (wv1.…) or a steer token (sv1.…)
   * @param {object} options  gatherMs (ICE gathering is awaited this long at most, default 5000)
   */
  constructor(video, endpoint, bearer, { gatherMs = 5000 } = {}) {
    super();
    this.video = video;
    this.endpoint = endpoint;
    this._bearer = bearer; // never logged: it is the viewer's capability
    this.gatherMs = gatherMs;
    this.pc = null;
    this.resource = null;
    this.playing = false;
    this.closed = false;
  }

  /** Offers, waits for the answer and applies it; resolves once the proxy answered 201. */
  async open() {
    const pc = new RTCPeerConnection();
    this.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.ontrack = e => { this.video.srcObject = new MediaStream([e.track]); this.video.play().catch(() => {}); };
    pc.onconnectionstatechange = () => {
      if (["failed", "closed"].includes(pc.connectionState) && !this.closed) this._lost(`connection ${pc.connectionState}`);
    };
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise(done => { // no trickle (the proxy answers PATCH 405): the offer holds every candidate
      if (pc.iceGatheringState === "complete") { done(); return; }
      const timer = setTimeout(done, this.gatherMs);
      pc.addEventListener("icegatheringstatechange", () => {
        if (pc.iceGatheringState === "complete") { clearTimeout(timer); done(); }
      });
    });
    if (this.closed) throw new Error("closed");
    const response = await fetch(this.endpoint, { method: "POST", body: pc.localDescription.sdp,
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${this._bearer}` } });
    const body = await response.text();
    if (response.status !== 201) {
      this.close();
      throw Object.assign(new Error(`WHEP ${response.status}: ${body.trim().slice(0, 200)}`), { status: response.status });
    }
    const location = response.headers.get("Location");
    if (location) { // the deployment's ?token= goes with the DELETE too (--token)
      const resource = new URL(location, this.endpoint);
      for (const [key, value] of new URL(this.endpoint).searchParams) if (!resource.searchParams.has(key)) resource.searchParams.set(key, value);
      this.resource = resource.href;
    }
    if (this.closed) { this._delete(); throw new Error("closed"); }
    await pc.setRemoteDescription({ type: "answer", sdp: body });
    this._watchFrames();
    return this;
  }

  /** "playing" once the first frame is presented (requestVideoFrameCallback where there is one). */
  _watchFrames() {
    const video = this.video;
    const first = () => { if (!this.playing && !this.closed) { this.playing = true; this.emit("playing", {}); } };
    if (typeof video.requestVideoFrameCallback === "function") video.requestVideoFrameCallback(first);
    else video.addEventListener("timeupdate", () => { if (video.currentTime > 0) first(); });
  }

  _lost(why) {
    this.emit("lost", { why });
    this.close();
  }

  _delete() {
    if (!this.resource) return;
    const resource = this.resource;
    this.resource = null;
    fetch(resource, { method: "DELETE", keepalive: true }).catch(() => {}); // the proxy ends it with the session anyway
  }

  /** Ends the viewer: the peer connection closes and its resource is deleted (`deleteResource`
   * false: the session ended, and the proxy ends its viewers itself). */
  close(deleteResource = true) {
    if (this.closed) return;
    this.closed = true;
    if (this.pc) this.pc.close();
    if (deleteResource) this._delete();
  }
}
