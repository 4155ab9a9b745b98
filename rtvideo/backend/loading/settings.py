"""Backend settings: the `parameters` of `config.pbtxt`, each declared once, validated at model load.

`rtvideo serve` derives one flag per field (`--max-sessions`, ...) and passes the
values on as `parameters` of a derived model copy.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo import settings_text
from rtvideo.backend import catalog
from rtvideo.backend.media.image_reference import MediaPolicy
from rtvideo.backend.runtime import capacity
from rtvideo.backend.vllm_omni import engine_limits, interaction_rules, model_rules, presets
from rtvideo.backend.vllm_omni.model_rules import ModelRules
from rtvideo.backend.vllm_omni.output_queue import DEFAULT_OUTPUT_QUEUE_BYTES
from rtvideo.core.interaction.refusal import PipelineInteractions
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.session_config import ModelCapabilities
from rtvideo.settings_text import setting

#: `max_sessions=auto` for the built-in generator: sized for a 2-core machine with 2 render
#: workers, with room to spare (the sizing rule is in the README)
BUILTIN_MAX_SESSIONS = 16

#: `render_priority` values: SCHED_IDLE, or a nice value
RENDER_PRIORITIES = ("idle", *(str(n) for n in range(20)))


@dataclass(frozen=True)
class BackendSettings:
    """Every knob of the model, with the defaults documented in the README."""

    generator: str = setting("builtin", "video generator: " + ", ".join(catalog.LIMITS))
    width: int = setting(256, "default frame width")
    height: int = setting(256, "default frame height")
    fps: int = setting(16, "default frames per second")
    frames_per_chunk: int = setting(9, "frames in each generation chunk")
    default_transition_chunks: int = setting(
        3, "transition length when an interaction gives none", flag="--transition-chunks"
    )
    #: chunks generation may run ahead of real-time playback; None = unpaced (benchmarks, offline)
    pacing_lead_chunks: float | None = setting(
        1.0, "chunks generation may run ahead of playback ('off': unpaced)", flag="--pacing-lead"
    )
    #: docs/protocol.md §7 "Pacing": with session.playback reports, the lead shrinks to what the
    #: generator's measured chunk times need (never above pacing_lead_chunks); false: reports are ignored
    playback_pacing: bool = setting(True, "pace to the players' session.playback reports (false: the fixed lead only)")
    #: `auto`: the generator's own limit (`session_limit`); a number: at most that many
    max_sessions: int | str = setting(
        "auto",
        "concurrent sessions in the model (server_busy beyond); auto: 16 for the built-in generator; for "
        "vllm_omni the engine's max_num_seqs where every session shares its batching key, else 1 (a number "
        "above max_num_seqs is refused at load)",
    )
    #: docs/triton-model.md "Real-time capacity" (`runtime/capacity.py`)
    realtime_capacity_fps: str = setting(
        "auto",
        "frames per second at the default size the model delivers in real time; a start beyond it by more "
        "than a tenth, beside at least one live session, gets server_busy. auto: measured (built-in: at load; "
        "vllm_omni: the engine's own chunk times as it runs); a number: that figure instead; off: measured "
        "and reported, nothing refused",
    )
    max_session_seconds: float = setting(3600.0, "longest session, in seconds")
    stall_timeout_seconds: float = setting(60.0, "end a session without generation progress for this long")
    device: str = setting("auto", "auto, cpu or cuda[:N]")
    torch_threads: int = setting(1, "CPU threads of torch and the BLAS libraries, per render process")
    render_workers: int = setting(
        2,
        "worker processes that render and encode the built-in generator's chunks, so video work "
        "never holds the interpreter that answers requests (0: in the model's own process; other "
        "generators ignore it)",
    )
    render_priority: str = setting(
        "idle",
        "CPU priority of the render workers: idle (Linux SCHED_IDLE: every request-path thread "
        "preempts them at once) or a nice value 0-19 (when other CPU-heavy work shares the model's cgroup)",
    )
    #: like vLLM's --served-model-name: empty = the Triton model's own name (see `served_names`)
    served_model_names: tuple[str, ...] = setting(
        (),
        "a name a session.start's model may ask for (repeatable; default: the Triton model's name); "
        "rtvideo-<generator> is always accepted",
        flag="--served-model-name",
    )
    # a start's image_reference (rtvideo/backend/media/image_reference.py, docs/protocol.md §2.1)
    allowed_media_domains: tuple[str, ...] = setting(
        (),
        "a host an image_reference URL may be fetched from (repeatable; '.example.com' takes its "
        "subdomains too; default: none, only data: URLs); loopback and private addresses never are",
        flag="--allowed-media-domains",
    )
    media_fetch_timeout_seconds: float = setting(
        3.0, "seconds a fetch of an image_reference URL may take (the start waits for it)"
    )
    # generator=vllm_omni: one vLLM-Omni AsyncOmni engine in the model process (README, "GPU with vLLM-Omni")
    vllm_omni_model: str = setting("BestWishYsh/Helios-Distilled", "vllm_omni: model id or local path")
    vllm_omni_engine_args: str = setting(
        "{}", "vllm_omni: AsyncOmni engine arguments, a JSON object (diffusion_streaming_output is always on)"
    )
    vllm_omni_extra_params: str = setting(
        "auto",
        "vllm_omni: the model's preset extra_params (its extra_args), a JSON object; "
        "auto: the real-time preset of vllm_omni_model (vllm_omni/presets.py VLLM_OMNI_PRESETS)",
    )
    vllm_omni_max_request_frames: int = setting(
        presets.DEFAULT_MAX_REQUEST_FRAMES,
        "vllm_omni: the longest session in frames (one engine request; its decoded frames stay on "
        "the GPU: docs/vllm-omni.md, GPU memory)",
    )
    vllm_omni_health_seconds: float = setting(5.0, "vllm_omni: seconds between engine health checks")
    vllm_omni_output_queue_bytes: int = setting(
        DEFAULT_OUTPUT_QUEUE_BYTES,
        "vllm_omni: bytes of decoded engine output one session may hold while it encodes; past it the "
        "session's engine request waits (one 640x384 Helios chunk is about 97 MB)",
    )
    #: what builds the engine: `module:callable` of an importable module, vLLM-Omni's own by
    #: default; another factory with its interface (a stand-in engine) runs the hosting code without a GPU
    vllm_omni_engine: str = setting(
        "vllm_omni:AsyncOmni", "vllm_omni: engine factory as module:callable (an importable module)"
    )

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> BackendSettings:
        """Parse string parameters; unknown names and bad values fail the model load loudly."""
        settings = settings_text.from_text(cls, params, what="model parameter")
        settings.check()
        return settings

    def check(self) -> None:
        limits = catalog.LIMITS.get(self.generator)
        if limits is None:
            raise ValueError(f"generator {self.generator!r} is not available; choose one of {tuple(catalog.LIMITS)}")
        positive = ("width", "height", "fps", "frames_per_chunk", "torch_threads")
        self.explicit_max_sessions()  # ValueError unless auto or a positive number
        capacity.parse_setting(self.realtime_capacity_fps)
        if self.render_workers < 0:
            raise ValueError("render_workers must be >= 0")
        if self.render_priority not in RENDER_PRIORITIES:
            raise ValueError(f"render_priority {self.render_priority!r}: use idle or a nice value 0-19")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model parameter {name} must be positive")
        problem = limits.size_problem(self.width, self.height) or limits.fps_problem(self.fps)
        if problem:
            raise ValueError(f"model parameters width/height/fps: {problem}")
        if self.default_transition_chunks < 0:
            raise ValueError("default_transition_chunks must be >= 0")
        if self.pacing_lead_chunks is not None and self.pacing_lead_chunks < 0:
            raise ValueError("pacing_lead_chunks must be >= 0 (or 'off')")
        if self.max_session_seconds <= 0 or self.stall_timeout_seconds <= 0:
            raise ValueError("max_session_seconds and stall_timeout_seconds must be positive")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device {self.device!r}: use auto, cpu or cuda[:N]")
        for name in self.served_model_names:
            if len(name) > 256 or not _NAME.fullmatch(name):
                raise ValueError(
                    f"served model name {name[:40]!r}: use 1-256 characters without spaces, "
                    "commas or quotes (e.g. BestWishYsh/Helios-Distilled)"
                )

        self.engine_args()
        self.extra_params()
        if self.vllm_omni_max_request_frames <= 0:
            raise ValueError("model parameter vllm_omni_max_request_frames must be positive")
        if self.vllm_omni_health_seconds <= 0:
            raise ValueError("vllm_omni_health_seconds must be positive")
        if self.vllm_omni_output_queue_bytes <= 0:
            raise ValueError("vllm_omni_output_queue_bytes must be positive")
        if not 0 < self.media_fetch_timeout_seconds <= 60:
            raise ValueError("media_fetch_timeout_seconds must be in (0, 60]")
        for domain in self.allowed_media_domains:
            if not _DOMAIN.fullmatch(domain):
                raise ValueError(f"allowed media domain {domain[:60]!r}: use a host name like images.example.com")
        if not _FACTORY.fullmatch(self.vllm_omni_engine):
            raise ValueError(f"vllm_omni_engine {self.vllm_omni_engine!r}: use module:callable (an importable module)")
        self._check_model_rules()

    def media_policy(self) -> MediaPolicy:
        """Where a start's `image_reference` may be fetched from, and for how long."""
        return MediaPolicy(
            allowed_domains=tuple(self.allowed_media_domains), timeout_seconds=self.media_fetch_timeout_seconds
        )

    def engine_args(self) -> dict[str, Any]:
        """`vllm_omni_engine_args` as a dict (ValueError naming the parameter when it is not one)."""
        return _json_object("vllm_omni_engine_args", self.vllm_omni_engine_args)

    def model_rules(self) -> model_rules.ModelRules | None:
        """The deployed vLLM-Omni model's own rules (`vllm_omni/model_rules.py`), found by its
        pipeline class or model id, as this deployment's `extra_params` make them (Helios' grid
        is its pyramid's); None for the built-in generator or a model without rules."""
        rules = self._table_rules()
        if rules is None:
            return None
        deployed = interaction_rules.deploy_model_config(self.engine_args().get("deploy_config"))
        return rules.for_model_config(deployed).for_deployment(self.extra_params(), (self.width, self.height))

    def _table_rules(self) -> ModelRules | None:
        if self.generator != "vllm_omni":
            return None
        pipeline = interaction_rules.pipeline_class(self.vllm_omni_model, self.engine_args())
        return model_rules.find(self.vllm_omni_model, pipeline)

    def extra_params(self) -> dict[str, Any]:
        """`vllm_omni_extra_params` as a dict; `auto`: the preset's of the model ({} without one)."""
        if self.vllm_omni_extra_params.strip() == "auto":
            return presets.vllm_omni_preset(self.vllm_omni_model, self._table_rules())["extra_params"]
        return _json_object("vllm_omni_extra_params", self.vllm_omni_extra_params)

    def sampling_preset(self) -> dict[str, Any]:
        """What a `vllm_omni` session samples with unless its start says otherwise: the preset of
        the model (its sampling fields), with `extra_params` from `vllm_omni_extra_params`."""
        preset = presets.vllm_omni_preset(self.vllm_omni_model, self._table_rules())
        return {**preset, "extra_params": self.extra_params()}

    def _check_model_rules(self) -> None:
        """A deployment whose defaults break its model's rules fails at load, in the words a start would get."""
        rules = self.model_rules()
        if rules is None:
            return
        problem = (
            (model_rules.pyramid_problem(rules.name, self.extra_params()) if rules.pyramid else None)
            or rules.size_problem(self.width, self.height)
            or rules.fps_problem(self.fps)
        )
        if problem is None:
            steps = self.sampling_preset().get("num_inference_steps")
            if rules.steps is not None and steps is not None and steps != rules.steps:
                problem = f"{rules.name} runs exactly {rules.steps} inference steps, not {steps}"
        if problem is not None:
            raise ValueError(f"model parameters for {rules.name} ({self.vllm_omni_model}): {problem}")
        if rules.largest_frames(self.vllm_omni_max_request_frames) < 1:
            raise ValueError(f"vllm_omni_max_request_frames is below {rules.name}'s shortest request")

    def served_names(self, model_name: str) -> tuple[str, ...]:
        """The names a start may ask for, the reported one first: the served model names (default:
        the Triton model's name and the generator's model ids), then `rtvideo-<generator>`."""
        names = self.served_model_names or (model_name, *self.generator_model_ids())
        return tuple(dict.fromkeys((*names, f"rtvideo-{self.generator}")))

    def generator_model_ids(self) -> tuple[str, ...]:
        """Hook: the model ids the active generator answers to by default besides the Triton model
        name, e.g. a vLLM-Omni generator's Hugging Face id (`BestWishYsh/Helios-Distilled`), so
        that vLLM-Omni clients that send it need no --served-model-name. None for the built-in."""
        return (self.vllm_omni_model,) if self.generator == "vllm_omni" else ()

    def explicit_max_sessions(self) -> int | None:
        """`max_sessions` when the deployer set a number, None for `auto` (ValueError otherwise)."""
        text = str(self.max_sessions).strip().lower()
        if text == "auto":
            return None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"model parameter max_sessions={self.max_sessions!r}: use auto or a number") from None
        if value <= 0:
            raise ValueError("model parameter max_sessions must be positive (or auto)")
        return value

    def session_limit(self, engine_limit: int | None = None, engine_limit_from: str = "") -> int:
        """Sessions the model holds at once (`session_rule`, without its reason)."""
        return self.session_rule(engine_limit, engine_limit_from).sessions

    def session_rule(self, engine_limit: int | None = None, engine_limit_from: str = "") -> engine_limits.SessionLimit:
        """Sessions the model holds at once, and why. The built-in generator: `max_sessions`,
        `auto` being BUILTIN_MAX_SESSIONS. vLLM-Omni: one engine request per session, and the
        engine runs at most `engine_limit` requests (its `max_num_seqs`), of which only requests
        with one batching key at once (`vllm_omni/engine_limits.py`); a session beyond would wait
        inside the engine with no server_busy, so `auto` is that number where every session
        shares the key, else 1, and a number above `engine_limit` fails the load."""
        explicit = self.explicit_max_sessions()
        if engine_limit is None:
            if explicit is None:
                return engine_limits.SessionLimit(BUILTIN_MAX_SESSIONS, "auto: the built-in generator's default")
            return engine_limits.SessionLimit(explicit, f"max_sessions={explicit} set by the deployer")
        if explicit is not None and explicit > engine_limit:
            raise ValueError(
                f"model parameter max_sessions={explicit} is above the engine's max_num_seqs={engine_limit} "
                f"({engine_limit_from or 'the engine'}): sessions beyond it would wait inside the engine "
                f"without server_busy. Set max_sessions to at most {engine_limit} (or auto), or raise the "
                "engine's max_num_seqs where its pipeline runs several requests at once"
            )
        varying = engine_limits.batching_fields(self.capabilities("model"))
        return engine_limits.engine_session_limit(engine_limit, engine_limit_from, varying, explicit)

    def capacity_setting(self) -> float | str:
        """`realtime_capacity_fps` as `RealtimeCapacity` takes it."""
        return capacity.parse_setting(self.realtime_capacity_fps)

    def check_sequence_slots(self, candidates: int | None) -> None:
        """`max_sessions` against the sequence batcher's `max_candidate_sequences`: with no slot to
        spare, a start beyond capacity waits silently in Triton's backlog instead of reaching the
        model (server_busy), and so does the proxy's health probe, which then fails: the backend
        is declared down and every session ends."""
        sessions = (
            self.explicit_max_sessions() or BUILTIN_MAX_SESSIONS
        )  # an engine's limit is checked against it at load
        if candidates is not None and sessions >= candidates:
            raise ValueError(
                f"model parameter max_sessions={sessions} must be below the sequence "
                f"batcher's max_candidate_sequences ({candidates}) in config.pbtxt"
            )

    def capabilities(self, model_name: str, engine_paces: bool = False) -> ModelCapabilities:
        """`engine_paces`: the loaded vLLM-Omni engine pauses paced requests itself
        (`EngineHost.paces`, detected at load), so `streaming_pacing` is honoured, not ignored."""
        entry = catalog.GENERATORS[self.generator]
        engine = self.generator == "vllm_omni"
        rules = self.model_rules()
        return ModelCapabilities(
            model_names=self.served_names(model_name),
            width=self.width,
            height=self.height,
            fps=self.fps,
            frames_per_chunk=self.frames_per_chunk,
            default_transition_chunks=self.default_transition_chunks,
            limits=rules or entry.limits,
            sampling_fields=entry.sampling_fields,
            extra_params=entry.extra_params,
            all_extra_params=entry.all_extra_params,
            start_fields=entry.start_fields,
            codec_options=engine,  # a start's video_codec_options configure our encoder (core/codec_options.py)
            # a source that paces (the built-in generator, when the deployment paces) takes the
            # session's lead from streaming_buffer_seconds; an engine paces only by itself (0.32)
            paces=engine_paces if engine else self.pacing_lead_chunks is not None,
            sampling_defaults=self.sampling_preset() if engine else None,
            max_num_frames=self.vllm_omni_max_request_frames if engine else None,
            model_rules=rules.describe() if rules is not None else None,
            interactions=self.interactions(),
            pipeline_interactions=self.pipeline_interactions(),
        )

    def interactions(self) -> InteractionSupport:
        """The active generator's interactions (its catalog entry), with a known pipeline's kinds."""
        support = catalog.GENERATORS[self.generator].interactions
        pipeline = self.pipeline_interactions()
        if pipeline is not None:
            support = dataclasses.replace(support, kinds=tuple(sorted(pipeline.modalities)))
        return support

    def pipeline_interactions(self) -> PipelineInteractions | None:
        """The modalities the deployed vLLM-Omni pipeline registers (the model rule table's, by its
        class or model id: `model_rules.pipeline_interactions`), which the model's admission refuses
        beyond; None for the built-in generator, or a pipeline that cannot be known here."""
        if self.generator != "vllm_omni":
            return None
        pipeline = interaction_rules.pipeline_class(self.vllm_omni_model, self.engine_args())
        return model_rules.pipeline_interactions(self.vllm_omni_model, pipeline)


#: a served model name: what a Hugging Face id or a Triton model name looks like, and what a
#: config.pbtxt string value and a comma-separated list can carry
_NAME = re.compile(r"[^\s,\"'\\]+")
#: an engine factory: a dotted module name, a colon, a name in it
_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
#: an allowed media domain: a host name, or '.' and a domain for it and its subdomains
_DOMAIN = re.compile(r"\.?[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*")


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"model parameter {name} is not valid JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"model parameter {name} must be a JSON object, not {text!r}")
    return value
