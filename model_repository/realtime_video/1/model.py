"""Triton Python-backend adapter for `realtime_video`: translate requests, delegate to rtvideo.

Decoupled: `execute()` queues each request for the session manager's dispatch thread and
returns at once; the session's worker thread streams responses on the start request's sender.
Invariant: every `pb_utils` call (a send, a cancellation poll, a metric update) is IPC to
tritonserver and takes its turn on `_IPC`, one call at a time.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import triton_python_backend_utils as pb_utils

from rtvideo import logsetup
from rtvideo.backend.builtin.devices import device_from_args
from rtvideo.backend.loading.assembly import build_manager
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime import metrics, tracing
from rtvideo.backend.runtime.dispatch import RequestDispatcher
from rtvideo.backend.runtime.memory import MemoryProbe
from rtvideo.backend.runtime.metrics import BufferedMetrics
from rtvideo.backend.runtime.priority_lock import PriorityLock
from rtvideo.backend.runtime.sequence_slots import SequenceSlots
from rtvideo.process import shm, watchdog
from rtvideo.process.interpreter import worker_python
from rtvideo.triton import wire

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# pb_utils calls are not safe concurrently from several threads, so they take turns. A turn
# lasts from microseconds (an ack) to milliseconds (a video chunk): whoever answers a request
# (an ack, a pong, an error: a client is timing it) goes ahead of waiting chunk sends and polls.
_IPC = PriorityLock()


class TritonChannel:
    """A request's decoupled response sender as the runtime's `Channel`.

    Once its FINAL response is sent, Triton may free the request's response factory, and no
    call may reach the sender any more: after FINAL the channel answers "cancelled" itself
    (nothing can be delivered) and sends nothing. The FINAL flag and that check share `_IPC`,
    so a poll from another thread (the session manager's watch loop) never races a FINAL.
    """

    def __init__(self, sender: Any, *, urgent: bool = False) -> None:
        self._sender = sender
        self._complete = False
        self._urgent = urgent  # the answer to a request (see _IPC), not a session's stream

    def send(self, message: Mapping[str, Any] | None, data: bytes = b"", *, final: bool = False) -> None:
        if message is None:
            with _IPC.hold(self._urgent):
                if not self._complete:
                    self._complete = True
                    self._sender.send(flags=FINAL)
            return
        meta, payload = wire.response_arrays(message, data)
        with _IPC.hold(self._urgent):
            if self._complete:
                raise RuntimeError("the request's responses are complete")
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(wire.META, meta), pb_utils.Tensor(wire.DATA, payload)]
            )
            self._sender.send(response, flags=FINAL if final else 0)
            self._complete = final

    def is_cancelled(self) -> bool:
        with _IPC.hold():
            return self._complete or self._sender.is_cancelled()


class TritonMetricsPublisher:
    """Flushes the runtime's buffered metrics to Triton custom metrics (Triton's /metrics), and
    with each flush the heartbeat (`rtvideo_model_heartbeat_seconds`, unix time) while `alive()`
    says the model's request path moves: the proxy's supervisor reads it to tell a model whose
    sequence slots are all held (busy) from a dead or wedged one (docs/protocol.md §8)."""

    def __init__(self, model: str, source: BufferedMetrics, interval: float = 1.0, instance: str = "") -> None:
        # Each model instance (one per GPU of a KIND_GPU group) publishes its own series.
        self._labels = {"model": model, "instance": instance} if instance else {"model": model}
        self._source = source
        #: whether the model's request path moves (the model sets it once its dispatcher exists)
        self.alive: Callable[[], bool] = lambda: True
        # Families must outlive their metrics, so keep them all.
        self._families = {
            name: pb_utils.MetricFamily(name, doc, getattr(pb_utils.MetricFamily, kind))
            for name, (doc, kind) in metrics.FAMILIES.items()
        }
        self._metrics: dict[tuple[str, str, str], Any] = {}
        self._metric(metrics.ACTIVE_SESSIONS).set(0)
        # Per-chunk histograms (generation, encoding, realtime factor), exported from the start.
        self._histograms = {
            name: pb_utils.MetricFamily(name, doc, pb_utils.MetricFamily.HISTOGRAM)
            for name, (doc, _) in metrics.HISTOGRAMS.items()
        }
        self._observers = {
            name: family.Metric(labels=self._labels, buckets=list(metrics.HISTOGRAMS[name][1]))
            for name, family in self._histograms.items()
        }
        #: called before each flush (the model sets it: the generator's memory gauges)
        self.sample: Callable[[], None] = lambda: None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="metrics", daemon=True)
        self._thread.start()

    def _metric(self, family: str, key: str = "", value: str = "") -> Any:
        metric = self._metrics.get((family, key, value))
        if metric is None:
            labels = {**self._labels, key: value} if key else self._labels
            metric = self._metrics[(family, key, value)] = self._families[family].Metric(labels)
        return metric

    def flush(self) -> None:
        if self.alive():
            self._source.heartbeat(time.time())
        self.sample()
        snapshot = self._source.drain()
        if not snapshot.increments and not snapshot.gauges and not snapshot.observations:
            return
        with _IPC.hold():
            for key, amount in snapshot.increments.items():
                self._metric(*key).increment(amount)
            for key, value in snapshot.gauges.items():
                self._metric(*key).set(value)
            for name, values in snapshot.observations.items():
                for value in values:
                    self._observers[name].observe(value)

    def _run(self, interval: float) -> None:
        while not self._closing.wait(interval):
            self.flush()

    def close(self) -> None:
        self._closing.set()
        self._thread.join()
        self.flush()


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        shm.restrict_own_region()  # this stub's /dev/shm region: its user's alone (it is created 0644)
        # Ends this process when tritonserver dies, whatever its own exit does (rtvideo/process/watchdog.py).
        self._watchdog = watchdog.start(worker_python())
        logsetup.configure("INFO", fmt=os.environ.get("RTVIDEO_LOG_FORMAT", "text"))
        # Session threads hold the GIL between torch/PyAV calls; a shorter switch interval
        # lets execute() (acks) in sooner.
        sys.setswitchinterval(0.001)
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("realtime_video must be decoupled")
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        settings = BackendSettings.from_parameters(params)
        # A KIND_GPU instance runs on its own GPU (cuda:<model_instance_device_id>) unless `device` says otherwise.
        settings = dataclasses.replace(settings, device=device_from_args(settings.device, args))
        settings.check_sequence_slots(candidate_sequences(config))
        buffered = BufferedMetrics()
        self._publisher = TritonMetricsPublisher(
            args["model_name"], buffered, instance=args.get("model_instance_name", "")
        )
        # A failed engine (generator=vllm_omni) ends its sessions and makes the model refuse the
        # health probe (SessionManager.backend_failed), so the proxy takes it for down. The model
        # does not ask Triton to unload itself as vllm_backend does: pb_utils.unload_model needs
        # --model-control-mode=explicit, and is not safe in the default mode.
        self._manager = build_manager(
            settings, args["model_name"], buffered, idle_timeout_seconds=sequence_idle_seconds(config)
        )
        # what the model says of its batcher's slots, so the proxy tells full from late (docs/operations.md)
        self._slots = SequenceSlots(candidate_sequences(config), sequence_idle_seconds(config))
        self._dispatcher = RequestDispatcher(self._manager.on_request)
        self._manager.serve_on(self._dispatcher.call_soon)  # a remote image_reference is fetched off this thread
        self._publisher.alive = self._dispatcher.moving
        self._publisher.sample = memory_sampler(MemoryProbe(settings.device), self._manager, buffered, self._slots)
        # torch, PyAV and numpy leave ~10^5 objects that live as long as the model: frozen, no full
        # garbage collection walks them (each walk would pause every session's thread).
        gc.freeze()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            start = bool(_control(request, wire.START))
            end = bool(_control(request, wire.END))
            corrid = _control(request, wire.CORRID)
            self._slots.request(corrid, end=end)  # here, not on the dispatch thread: Triton's view now
            parameters = request.parameters()
            channel = TritonChannel(request.get_response_sender(), urgent=not start)
            self._dispatcher.submit(
                corrid,
                wire.request_payload(_input(request, wire.REQUEST)),
                start=start,
                end=end,
                # a traced session's start stream records its chunks' spans (docs/operations.md "Traces")
                channel=tracing.traced(channel, wire.request_traceparent(parameters)) if start else channel,
                secret=wire.session_secret(parameters),
            )

    def finalize(self) -> None:
        self._dispatcher.close()
        self._manager.shutdown()
        self._publisher.close()
        tracing.shutdown()


def memory_sampler(
    probe: MemoryProbe, manager: Any, buffered: BufferedMetrics, slots: SequenceSlots
) -> Callable[[], None]:
    """The gauges read at each metrics flush: the generator's memory (rtvideo/backend/runtime/memory.py)
    and the batcher's slots its sequences hold (rtvideo/backend/runtime/sequence_slots.py)."""

    def sample() -> None:
        reading = probe.read(manager.active_sessions)
        if reading is not None:
            buffered.set_memory(*reading)
        if slots.slots is not None:
            buffered.set_sequence_slots(slots.held(), slots.slots)

    return sample


def candidate_sequences(config: Mapping[str, Any]) -> int | None:
    """The `oldest` sequence batcher's `max_candidate_sequences` (this instance's slots), or None."""
    value = config.get("sequence_batching", {}).get("oldest", {}).get("max_candidate_sequences")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def sequence_idle_seconds(config: Mapping[str, Any]) -> float | None:
    """The sequence batcher's `max_sequence_idle_microseconds` in the model config Triton hands
    to `initialize` (a uint64, so a JSON string), in seconds; None when it is not there."""
    value = config.get("sequence_batching", {}).get("max_sequence_idle_microseconds")
    try:
        micros = int(value)
    except (TypeError, ValueError):
        return None
    return micros / 1e6 if micros > 0 else None


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor.as_numpy() if tensor is not None else None


def _control(request: Any, name: str) -> int:
    return wire.control_value(_input(request, name))
