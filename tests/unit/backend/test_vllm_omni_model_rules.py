"""The model rule table (`rtvideo/backend/vllm_omni/model_rules.py`) against the pinned wheel's
pipeline code, and the refusals it gives before the engine.

Each rule is read in the wheel's source (nothing of it is imported: it needs vLLM and CUDA), so
a wrong entry fails here and not on a GPU.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
import yaml

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni import interaction_rules, model_rules, presets
from rtvideo.backend.vllm_omni.model_rules import HELIOS, HELIOS_DISTILLED, LINGBOT_WORLD, FirstFrame, FirstFrameAt
from rtvideo.backend.vllm_omni.source import EngineSources
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.vllm_omni_wheel import wheel_source

HELIOS_PIPELINE = "vllm_omni/diffusion/models/helios/pipeline_helios.py"
HELIOS_TRANSFORMER = "vllm_omni/diffusion/models/helios/helios_transformer.py"
LINGBOT_PIPELINE = "vllm_omni/diffusion/models/lingbot_world/pipeline.py"
LINGBOT_TRANSFORMER = "vllm_omni/diffusion/models/lingbot_world/transformer.py"
LINGBOT_DEPLOY = "vllm_omni/deploy/lingbot_world_v2_stepwise.yaml"
DATA_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def _int_assignment(source: str, name: str) -> int:
    match = re.search(rf"^{name} = (.+)$", source, re.M)
    assert match, f"{name} not found"
    return int(eval(match.group(1), {}))  # a literal product such as 480 * 832


def _default_patch_size(source: str) -> tuple[int, ...]:
    match = re.search(r"patch_size: tuple\[int, \.\.\.\] = \((\d+), (\d+), (\d+)\)", source) or re.search(
        r"patch_size: tuple\[int, int, int\] = \((\d+), (\d+), (\d+)\)", source
    )
    assert match
    return tuple(int(g) for g in match.groups())


# --- Helios --------------------------------------------------------------------------------------
def test_helios_sizes_floor_to_16_and_stage2_halves_the_latent_per_extra_stage() -> None:
    source = wheel_source(HELIOS_PIPELINE)
    assert 'extra.get("height", 384)) // 16) * 16' in source and 'extra.get("width", 640)) // 16) * 16' in source
    assert re.search(r'for _ in range\(extra\["pyramid_num_stages"\] - 1\):\s+height //= 2\s+width //= 2', source)
    spatial = int(re.search(r"self\.vae_scale_factor_spatial = .* else (\d+)", source).group(1))  # type: ignore[union-attr]
    patch = _default_patch_size(wheel_source(HELIOS_TRANSFORMER))
    assert patch[1:] == (2, 2)
    # a side must stay whole through the VAE (8), each halving and the 2-pixel patch: 16 * 2^(stages-1)
    stages = HELIOS_DISTILLED.preset["extra_params"]["pyramid_num_stages"]
    assert HELIOS_DISTILLED.grid == spatial * patch[1] * 2 ** (stages - 1) == 64
    assert HELIOS.grid == spatial * patch[1] == 16 and "pyramid_num_stages" not in HELIOS.preset["extra_params"]
    assert HELIOS_DISTILLED.size_problem(640, 384) is None
    for width, height in ((832, 480), (1280, 720), (640, 360)):  # floor to 16 passes them, stage 2 does not
        assert "multiple of 64" in (HELIOS_DISTILLED.size_problem(width, height) or "")
        assert (HELIOS.size_problem(width, height) is None) == (height % 16 == 0)


def test_helios_grid_is_the_requests_pyramids_and_stage2_needs_a_step_count_per_stage() -> None:
    source = wheel_source(HELIOS_PIPELINE)
    # the pipeline's own defaults: stage 2 off, 3 stages
    assert '"is_enable_stage2": bool(extra.get("is_enable_stage2", False))' in source
    assert '"pyramid_num_stages": int(extra.get("pyramid_num_stages", 3))' in source
    assert (model_rules.HELIOS_STAGE2_DEFAULT, model_rules.HELIOS_STAGES_DEFAULT) == (False, 3)
    # stage 2 counts the whole step list and indexes it by stage; the scheduler has 3 stages
    assert 'for num_steps in extra["pyramid_num_inference_steps_list"]' in source
    assert 'extra["pyramid_num_inference_steps_list"][stage_index]' in source
    scheduler = wheel_source("vllm_omni/diffusion/models/helios/scheduling_helios.py")
    assert f"stages: int = {model_rules.HELIOS_SCHEDULER_STAGES}," in scheduler
    assert "stage_timesteps = self.timesteps_per_stage[stage_index]" in scheduler
    grid = model_rules.pyramid_grid
    assert grid({}) == 16 and grid({"is_enable_stage2": True}) == 64
    assert grid({"is_enable_stage2": True, "pyramid_num_stages": 2}) == 32
    stage2 = HELIOS_DISTILLED.preset["extra_params"]
    assert model_rules.pyramid_problem("H", stage2) is None
    assert "one step count per stage (3)" in (
        model_rules.pyramid_problem("H", {**stage2, "pyramid_num_inference_steps_list": [1, 1]}) or ""
    )
    assert "1 to 3" in (model_rules.pyramid_problem("H", {**stage2, "pyramid_num_stages": 4}) or "")
    # a deployment or a request that turns stage 2 on or off moves the grid with it
    assert HELIOS.for_deployment(stage2).grid == 64 and HELIOS_DISTILLED.for_deployment({}).grid == 16


def test_helios_chunks_are_33_frames_and_a_request_runs_whole_chunks() -> None:
    source = wheel_source(HELIOS_PIPELINE)
    latent = int(re.search(r'extra\.get\("num_latent_frames_per_chunk", (\d+)\)', source).group(1))  # type: ignore[union-attr]
    temporal = int(re.search(r"self\.vae_scale_factor_temporal = .* else (\d+)", source).group(1))  # type: ignore[union-attr]
    assert "window_num_frames = (num_latent_frames_per_chunk - 1) * self.vae_scale_factor_temporal + 1" in source
    assert "num_latent_chunk = max(1, (num_frames + window_num_frames - 1) // window_num_frames)" in source
    for rules in (HELIOS, HELIOS_DISTILLED):
        assert rules.frames_per_chunk == (latent - 1) * temporal + 1 == 33
        assert rules.frame_modulus == 1  # any count: the engine rounds up to whole chunks
    # so the cap is whole chunks: 1456 would run 45 chunks, past the memory bound
    assert HELIOS_DISTILLED.largest_frames(1456) == 1452 == presets.DEFAULT_MAX_REQUEST_FRAMES
    assert HELIOS_DISTILLED.chunk_frames(1452) == [33] * 44 and HELIOS_DISTILLED.chunk_frames(1456) == [33] * 45


def test_helios_reads_its_first_frame_from_extra_args_in_step_mode() -> None:
    source = wheel_source(HELIOS_PIPELINE)
    assert 'image = extra.get("image")' in source
    assert "def prepare_image_latents(" in source and "image = image.unsqueeze(2)" in source  # [B, C, H, W]
    for rules in (HELIOS, HELIOS_DISTILLED):
        assert rules.first_frame_at is FirstFrameAt.EXTRA_ARGS and rules.first_frame is FirstFrame.OPTIONAL


def test_a_streaming_request_always_carries_a_step_count() -> None:
    """The step scheduler (streaming runs it) asserts a count; where nothing gives one the engine
    host sends the Helios pipelines' own fallback."""
    scheduler = wheel_source("vllm_omni/diffusion/sched/step_scheduler.py")
    assert "assert sampling.num_inference_steps is not None" in scheduler
    fallback = f'extra.get("num_inference_steps", {model_rules.STEP_MODE_DEFAULT_STEPS})'
    assert fallback in wheel_source(HELIOS_PIPELINE)


# --- LingBot-World ------------------------------------------------------------------------------
def test_lingbot_renders_its_cache_size_only() -> None:
    source = wheel_source(LINGBOT_PIPELINE)
    height = int(re.search(r'model_config\.get\("ar_diffusion_height", (\d+)\)', source).group(1))  # type: ignore[union-attr]
    width = int(re.search(r'model_config\.get\("ar_diffusion_width", (\d+)\)', source).group(1))  # type: ignore[union-attr]
    deploy = yaml.safe_load(wheel_source(LINGBOT_DEPLOY))
    model_config = deploy["stages"][0]["model_config"]
    assert (model_config["ar_diffusion_width"], model_config["ar_diffusion_height"]) == (width, height)
    assert LINGBOT_WORLD.exact_sizes == ((width, height),) == ((832, 480),)
    assert _int_assignment(source, "_MAX_PIXEL_AREA") >= width * height
    assert LINGBOT_WORLD.size_problem(640, 384) == "LingBot-World renders 832×480 only, not 640×384"


def test_lingbots_size_is_the_deploy_configs_cache_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The pipeline sizes its AR cache from the deploy config's `model_config` (the keys read
    above): a deployment that sets another size renders that size only, and says so."""
    assert LINGBOT_WORLD.size_keys == ("ar_diffusion_width", "ar_diffusion_height")
    deploy = tmp_path / "small.yaml"
    deploy.write_text(
        yaml.safe_dump(
            {
                "stages": [
                    {
                        "model_class_name": "LingBotWorldCausalDMDPipeline",
                        "model_config": {"ar_diffusion_width": 64, "ar_diffusion_height": 48},
                    }
                ]
            }
        )
    )
    small = LINGBOT_WORLD.for_model_config(interaction_rules.deploy_model_config(str(deploy)))
    assert small.exact_sizes == ((64, 48),) and small.size_problem(64, 48) is None
    assert small.size_problem(832, 480) == "LingBot-World renders 64×48 only, not 832×480"
    assert LINGBOT_WORLD.for_model_config({}) is LINGBOT_WORLD  # no keys: the pipeline's default size
    assert HELIOS_DISTILLED.for_model_config({"ar_diffusion_width": 64, "ar_diffusion_height": 48}) is HELIOS_DISTILLED


def test_lingbot_steps_frames_first_frame_and_class() -> None:
    source = wheel_source(LINGBOT_PIPELINE)
    timesteps = ast.literal_eval(re.search(r"^LINGBOT_DMD_TIMESTEPS = (.+)$", source, re.M).group(1))  # type: ignore[union-attr]
    assert LINGBOT_WORLD.steps == len(timesteps) == 4
    assert "if num_inference_steps != len(LINGBOT_DMD_TIMESTEPS):" in source
    # (n - 1) % temporal == 0 and ((n - 1) // temporal + 1) % block == 0
    assert "if (num_frames - 1) % temporal_factor:" in source and "if num_latent_frames % block_frames:" in source
    block = int(re.search(r"num_frames_per_block: int = (\d+)", wheel_source(LINGBOT_TRANSFORMER)).group(1))  # type: ignore[union-attr]
    temporal = int(re.search(r'scale_factor_temporal", (\d+)\)', source).group(1))  # type: ignore[union-attr]
    valid = [n for n in range(1, 200) if (n - 1) % temporal == 0 and ((n - 1) // temporal + 1) % block == 0]
    assert valid == [n for n in range(1, 200) if LINGBOT_WORLD.valid_frames(n)]
    assert (LINGBOT_WORLD.frame_modulus, LINGBOT_WORLD.frame_remainder) == (12, 9)
    # a chunk is one block: the opening latent decodes to one frame, every later one to `temporal`
    assert "return (block_frames - 1) * self.vae_scale_factor_temporal + 1" in source
    assert "return block_frames * self.vae_scale_factor_temporal" in source
    assert LINGBOT_WORLD.first_chunk_frames == (block - 1) * temporal + 1 == 9
    assert LINGBOT_WORLD.frames_per_chunk == block * temporal == 12
    assert LINGBOT_WORLD.chunk_frames(21) == [9, 12] and LINGBOT_WORLD.chunk_frames(885) == [9] + [12] * 73
    assert 'raise ValueError("LingBot World requires exactly one image in multi_modal_data.image.")' in source
    assert LINGBOT_WORLD.first_frame is FirstFrame.REQUIRED and LINGBOT_WORLD.first_frame_at is FirstFrameAt.PROMPT
    deploy = yaml.safe_load(wheel_source(LINGBOT_DEPLOY))
    stage = deploy["stages"][0]
    assert stage["model_class_name"] in LINGBOT_WORLD.pipeline_classes
    assert stage["default_sampling_params"]["num_inference_steps"] == LINGBOT_WORLD.preset["num_inference_steps"]
    assert stage["default_sampling_params"]["extra_args"] == LINGBOT_WORLD.preset["extra_params"]
    assert stage["step_execution"] is True and stage["streaming_output"] is True


def test_lingbot_requests_are_valid_counts_within_the_caps() -> None:
    # LingBot-World keeps no decoded history (below): its cap is the deployment's, not Helios' memory's
    assert LINGBOT_WORLD.memory_cap(832, 480) is None
    assert LINGBOT_WORLD.frame_cap(832, 480, 1452) == 1449  # the largest 12k + 9 within 1452
    assert [LINGBOT_WORLD.request_frames(n, 885) for n in (1, 9, 10, 21, 22, 5000)] == [9, 9, 21, 21, 33, 885]
    sources = EngineSources(None, {}, 3600.0, None, max_request_frames=1452, rules=LINGBOT_WORLD)  # type: ignore[arg-type]
    config = resolve_session_config(
        validate_start(check_first_message(json.dumps(_start(image=True)))), _lingbot().capabilities("m")
    )
    assert config.num_frames == 1449 and sources.engine_frames(config) == 1449  # 290 s at 5 fps, not 177 s
    longer = _lingbot(vllm_omni_max_request_frames="6000").capabilities("m")
    config = resolve_session_config(validate_start(check_first_message(json.dumps(_start(image=True)))), longer)
    assert config.num_frames == 5997  # a deployer may raise it: memory does not grow with it


# --- each model's memory, from its own pipeline ----------------------------------------------------
def _method(source: str, name: str) -> str:
    """The text of method `name` in `source` (up to the next method of the class)."""
    start = source.index(f"    def {name}(")
    end = source.find("\n    def ", start + 1)
    return source[start : end if end > 0 else None]


def test_helios_holds_its_decoded_history_twice_at_each_concatenation() -> None:
    """`post_decode` decodes the chunk and concatenates it onto `history_video`: the old history,
    the chunk and the new history coexist until the old one is freed, so the peak near the cap
    is two histories (`HISTORY_PEAK_COPIES`); the VAE is float32 (`FLOAT32_RGB_BYTES`)."""
    source = wheel_source(HELIOS_PIPELINE)
    post_decode = _method(source, "post_decode")
    assert "current_video = self.vae.decode(current_latents, return_dict=False)[0]" in post_decode
    assert 'extra["history_video"] = torch.cat([extra["history_video"], current_video], dim=2)' in post_decode
    assert "history_video" not in post_decode.split('torch.cat([extra["history_video"]')[1].split("output =")[1]
    assert 'subfolder="vae", torch_dtype=torch.float32' in source
    assert (model_rules.HISTORY_PEAK_COPIES, model_rules.FLOAT32_RGB_BYTES) == (2, 12)
    for rules in (HELIOS, HELIOS_DISTILLED):
        assert rules.memory is model_rules.MemoryRule.DECODED_HISTORY
        # the cap is unchanged (1452 at 640x384); its peak is now stated: 2 x 1452 x 2.8 MiB = 7.98 GiB
        assert rules.memory_cap(640, 384) == 1452
        peak = rules.memory_peak_bytes(640, 384, 1452)
        assert peak == 2 * 1452 * 640 * 384 * 12 <= model_rules.REQUEST_MEMORY_BOUND_BYTES == 8 * 2**30
        assert peak > 4 * 2**30  # what the docs and the table stated before
        assert rules.memory_peak_bytes(1280, 704, rules.memory_cap(1280, 704)) <= 8 * 2**30  # type: ignore[arg-type]


def test_lingbot_keeps_a_fixed_window_and_no_decoded_history() -> None:
    """Step mode decodes each block to uint8 on the host and keeps none of it; the condition is
    encoded per block; the KV cache is a sink plus a sliding window: nothing grows with frames."""
    source = wheel_source(LINGBOT_PIPELINE)
    post_decode = _method(source, "post_decode")
    assert 'payload = {"video": self._decode_chunk_to_pixels(latents, session_id=state.request_id)}' in post_decode
    assert "torch.cat" not in post_decode and "history" not in post_decode
    assert "frames = frames.float().mul_(255).round_().to(torch.uint8)" in source  # 1 B a channel, on the host
    prepare = _method(source, "_prepare_next_chunk")
    assert "self._next_condition_chunk(" in prepare and "_prepare_condition(" not in prepare
    assert LINGBOT_WORLD.memory is model_rules.MemoryRule.FIXED_WINDOW
    # the window's geometry, from the transformer's checkpoint contract
    transformer = wheel_source(LINGBOT_TRANSFORMER)
    for key, value in (
        ("num_layers", model_rules.LINGBOT_LAYERS),
        ("num_attention_heads", model_rules.LINGBOT_HEADS),
        ("attention_head_dim", model_rules.LINGBOT_HEAD_DIM),
        ("sink_size", model_rules.LINGBOT_SINK_FRAMES),
        ("num_frames_per_block", model_rules.LINGBOT_BLOCK_FRAMES),
        ("sliding_window_num_frames", model_rules.LINGBOT_WINDOW_FRAMES),
        ("ffn_dim", 13824),
    ):
        assert f'"{key}": {value},' in transformer, key
    assert '"local_attn_size": -1,' in transformer  # so the window is sliding_window_num_frames
    # temporal RoPE past its table is computed, not refused: no frame limit from positions either
    assert "temporal_cosine, temporal_sine = _rope_axis(frames, temporal_dim, start=start_frame)" in transformer
    # the KV a session keeps: sink + window once per session, the block in flight and its scratch once
    manager = wheel_source("vllm_omni/experimental/ar_diffusion/kv_cache/manager.py")
    assert "resident_per_session = config.sink_chunks + config.window_chunks" in manager
    assert "minimum_scratch_blocks = self.frames_per_block + declared_scratch_blocks" in manager
    assert model_rules.LINGBOT_KV_FRAMES == 18 + 3 + 3
    assert model_rules.LINGBOT_TOKENS_PER_FRAME == (480 // 8 // 2) * (832 // 8 // 2) == 1560
    assert "_MAX_SEQUENCE_LENGTH = 512" in source and model_rules.LINGBOT_TEXT_TOKENS == 512
    assert "camera_tokens = tokens_per_frame * condition_latent_frames" in source
    state = LINGBOT_WORLD.session_state_bytes
    assert LINGBOT_WORLD.memory_peak_bytes(832, 480, 9) == LINGBOT_WORLD.memory_peak_bytes(832, 480, 9_999) == state
    assert 34e9 < state < 36e9  # 30.7 GB of KV, 0.4 GB of text K/V, 3.8 GB of camera modulation


def test_a_paused_session_lasts_its_models_own_number_of_chunks() -> None:
    """Helios hands over float32 chunks (97 MB at 640x384), LingBot-World uint8 ones (14.4 MB at
    832x480): a session that reads nothing holds 3 of one and 19 of the other under 256 MiB."""
    from rtvideo.backend.vllm_omni.output_queue import DEFAULT_OUTPUT_QUEUE_BYTES

    assert "return _uint8_frames(video)" in wheel_source(LINGBOT_PIPELINE)
    assert HELIOS_DISTILLED.output_chunk_bytes(640, 384) == 33 * 640 * 384 * 12 == 97_320_960
    assert LINGBOT_WORLD.output_chunk_bytes(832, 480) == 12 * 832 * 480 * 3 == 14_376_960
    assert HELIOS_DISTILLED.paused_chunks(DEFAULT_OUTPUT_QUEUE_BYTES, 640, 384) == 3
    assert LINGBOT_WORLD.paused_chunks(DEFAULT_OUTPUT_QUEUE_BYTES, 832, 480) == 19


def test_the_weights_are_the_checkpoints_parameter_counts() -> None:
    """A 14B DiT (40 blocks of width 5120, FFN 13824) in bf16, UMT5-XXL, the Wan VAE; online FP8
    quantizes LingBot-World's transformer alone (the pipeline hands it the quantization config)."""
    assert 14.0e9 < model_rules.WAN14B_DIT_PARAMS < 14.1e9
    assert 39e9 < LINGBOT_WORLD.weights_bytes < 41e9 and 39e9 < HELIOS_DISTILLED.weights_bytes < 41e9
    assert LINGBOT_WORLD.fp8_saving_bytes == model_rules.WAN14B_DIT_PARAMS  # 2 B -> 1 B a parameter
    source = wheel_source(LINGBOT_PIPELINE)
    assert (
        "self.transformer = CausalLingBotWorldTransformer3DModel.from_config(\n"
        "            transformer_config,\n"
        '            quant_config=getattr(od_config, "quantization_config", None),'
    ) in source
    assert source.count("quant_config=") == 1  # nothing else of the pipeline is quantized


def test_lingbots_model_id_is_the_checkpoint_its_pipeline_takes() -> None:
    """The pipeline takes one checkpoint, by its contract (v2, 14B, causal, 4-step DMD); that is
    `robbyant/lingbot-world-v2-14b-causal-fast-diffusers`, now found by its id as Helios' are."""
    transformer = wheel_source(LINGBOT_TRANSFORMER)
    assert "for the LingBot World v2 checkpoint" in transformer
    assert LINGBOT_WORLD.model_ids == ("robbyant/lingbot-world-v2-14b-causal-fast-diffusers",)
    assert model_rules.find("robbyant/lingbot-world-v2-14b-causal-fast-diffusers", None) is LINGBOT_WORLD
    preset = presets.VLLM_OMNI_PRESETS["robbyant/lingbot-world-v2-14b-causal-fast-diffusers"]
    assert preset["num_inference_steps"] == 4


@pytest.mark.parametrize("rules", model_rules.MODELS, ids=lambda r: r.name)
def test_every_model_states_its_checkpoints_license(rules: model_rules.ModelRules) -> None:
    assert rules.license
    if rules is LINGBOT_WORLD:
        assert "NC" in rules.license and "non-commercial" in rules.license


# --- the registry and the table agree ------------------------------------------------------------
def test_interaction_kinds_are_the_wheels_registry() -> None:
    tree = ast.parse(wheel_source("vllm_omni/diffusion/interaction/registry.py"))
    registry = next(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "STRUCTURED_HANDLER_REGISTRY"
    )
    assert isinstance(registry, ast.Dict)
    wheel = {
        ast.literal_eval(k): {ast.literal_eval(m) for m in v.keys}
        for k, v in zip(registry.keys, registry.values, strict=True)
    }  # type: ignore[arg-type, union-attr]
    for rules in model_rules.MODELS:
        for pipeline in rules.pipeline_classes:
            assert wheel[pipeline] == set(rules.interactions), pipeline
    # the registry lists no class the table does not: one the table does not name has no handler
    # (`model_rules.pipeline_interactions`, which the model's admission refuses by)
    assert set(wheel) == {pipeline for rules in model_rules.MODELS for pipeline in rules.pipeline_classes}


def test_the_class_comes_from_the_deploy_config(tmp_path) -> None:
    deploy = tmp_path / "lingbot.yaml"
    deploy.write_text(wheel_source(LINGBOT_DEPLOY))
    args = {"deploy_config": str(deploy)}
    assert interaction_rules.pipeline_class("/models/lingbot", args) == "LingBotWorldCausalDMDPipeline"
    assert interaction_rules.pipeline_class("/m", {**args, "model_class_name": "HeliosPipeline"}) == "HeliosPipeline"
    assert model_rules.find("/models/lingbot", "LingBotWorldCausalDMDPipeline") is LINGBOT_WORLD
    assert model_rules.find("BestWishYsh/Helios-Distilled", None) is HELIOS_DISTILLED
    assert model_rules.find("someone/else", None) is None


# --- refusals before the engine and at model load ------------------------------------------------
def _lingbot(**params: str) -> BackendSettings:
    return BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "vllm_omni_model": "/models/lingbot",
            "vllm_omni_engine_args": '{"model_class_name": "LingBotWorldCausalDMDPipeline"}',
            "width": "832",
            "height": "480",
            **params,
        }
    )


def _start(image: bool = False, **fields: object) -> dict:
    return {
        "type": "session.start",
        "prompt": "a street",
        **({"image_reference": {"image_url": DATA_URL}} if image else {}),
        **fields,
    }


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"width": 640, "height": 384, "image": True}, "LingBot-World renders 832×480 only, not 640×384"),
        ({}, "image_reference is required by LingBot-World (its first frame)"),
        ({"image": True, "num_inference_steps": 8}, "LingBot-World runs exactly 4 inference steps, not 8"),
        ({"image": True, "fps": 24}, "LingBot-World: fps 24 is not supported: use 1 to 16"),
    ],
)
def test_a_start_that_breaks_a_lingbot_rule_is_refused_by_name(fields: dict, words: str) -> None:
    image = bool(fields.pop("image", False))
    with pytest.raises(ProtocolError) as caught:
        resolve_session_config(
            validate_start(check_first_message(json.dumps(_start(image, **fields)))), _lingbot().capabilities("m")
        )
    assert caught.value.code is ErrorCode.INVALID_START and str(caught.value.message) == words


def test_a_helios_start_off_its_grid_is_refused_and_on_it_accepted() -> None:
    caps = BackendSettings.from_parameters({"generator": "vllm_omni", "width": "640", "height": "384"}).capabilities(
        "m"
    )
    with pytest.raises(ProtocolError, match="multiple of 64"):
        resolve_session_config(validate_start(check_first_message(json.dumps(_start(width=832, height=480)))), caps)
    config = resolve_session_config(
        validate_start(check_first_message(json.dumps(_start(width=1280, height=704)))), caps
    )
    assert config.to_json()["model_rules"] == HELIOS_DISTILLED.describe()
    assert config.to_json()["model_rules"]["size_multiple"] == 64
    assert config.num_frames == HELIOS_DISTILLED.memory_cap(1280, 704) < 1452  # the bound at its own size


@pytest.mark.parametrize(
    "extra,size,words",
    [
        ({"pyramid_num_stages": 2, "pyramid_num_inference_steps_list": [1, 1]}, (640, 384), None),
        ({"pyramid_num_inference_steps_list": [1, 1]}, (640, 384), "one step count per stage (3), not [1, 1]"),
        ({"pyramid_num_stages": 4, "pyramid_num_inference_steps_list": [1] * 4}, (640, 384), "must be 1 to 3"),
        # a deployment that runs stage 1 only (the 16 grid): a start turning stage 2 on needs 64
        ({"is_enable_stage2": True}, (832, 480), "height 480 is not supported: use a multiple of 64"),
    ],
)
def test_a_helios_start_that_changes_the_pyramid_is_checked_against_it(extra, size, words) -> None:
    deployed = {"is_enable_stage2": False} if "is_enable_stage2" in extra else HELIOS_DISTILLED.preset["extra_params"]
    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "vllm_omni_extra_params": json.dumps(deployed),
            "width": str(size[0]),
            "height": str(size[1]),
        }
    )
    start = validate_start(check_first_message(json.dumps(_start(width=size[0], height=size[1], extra_params=extra))))
    if words is None:
        assert resolve_session_config(start, settings.capabilities("m")).width == size[0]
        return
    with pytest.raises(ProtocolError) as caught:
        resolve_session_config(start, settings.capabilities("m"))
    assert caught.value.code is ErrorCode.INVALID_START and words in str(caught.value.message)


def test_a_deployments_own_pyramid_sets_its_grid() -> None:
    def helios(extra: dict, width: int, height: int) -> BackendSettings:
        return BackendSettings.from_parameters(
            {
                "generator": "vllm_omni",
                "vllm_omni_extra_params": json.dumps(extra),
                "width": str(width),
                "height": str(height),
            }
        )

    flat = helios({"is_enable_stage2": False}, 832, 480)  # stage 1 only: Helios' 16 grid
    assert flat.capabilities("m").model_rules["size_multiple"] == 16  # type: ignore[index]
    with pytest.raises(ValueError, match="one step count per stage"):
        helios({"is_enable_stage2": True, "pyramid_num_inference_steps_list": [1]}, 640, 384)


def test_a_deployment_that_breaks_its_models_rules_fails_at_load() -> None:
    with pytest.raises(ValueError, match="LingBot-World renders 832×480 only, not 640×384"):
        _lingbot(width="640", height="384")
    with pytest.raises(ValueError, match="Helios-Distilled: height 480 is not supported"):
        BackendSettings.from_parameters({"generator": "vllm_omni", "width": "832", "height": "480"})
    assert _lingbot().sampling_preset()["num_inference_steps"] == 4


def test_the_shipped_lingbot_deploy_config_is_the_wheels_where_the_rules_depend_on_it() -> None:
    from tests.support.paths import REPO_ROOT as ROOT

    ours = yaml.safe_load((ROOT / "deploy/gpu/lingbot_world_stepwise.yaml").read_text())
    wheel = yaml.safe_load(wheel_source(LINGBOT_DEPLOY))
    assert ours["pipeline"] == wheel["pipeline"] == "lingbot_world"
    (stage,), (theirs,) = ours["stages"], wheel["stages"]
    for key in ("model_class_name", "engine_backend", "step_execution", "streaming_output", "max_num_seqs"):
        assert stage[key] == theirs[key], key
    assert stage["default_sampling_params"] == theirs["default_sampling_params"]
    for key in ("ar_diffusion_height", "ar_diffusion_width"):
        assert stage["model_config"][key] == theirs["model_config"][key], key
    assert interaction_rules.deploy_config_class(str(ROOT / "deploy/gpu/lingbot_world_stepwise.yaml")) in (
        LINGBOT_WORLD.pipeline_classes
    )


@pytest.mark.parametrize("rules", [HELIOS_DISTILLED, LINGBOT_WORLD], ids=lambda r: r.name)
def test_the_docs_promise_the_fps_the_table_holds(rules: model_rules.ModelRules) -> None:
    """docs/vllm-omni.md's rates table and the rules table agree: the fps a deployment serves the
    model at (what the GPU check fails below) and the published figure's source."""
    from tests.support.paths import REPO_ROOT

    text = (REPO_ROOT / "docs" / "vllm-omni.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith(f"| {rules.name} | ")]
    _, _, measured, source, serve_at, _, _ = (cell.strip() for cell in row.split("|"))
    assert re.match(rf"(\*\*)?{rules.default_fps}\b", serve_at), serve_at
    assert rules.reference_fps is not None and f"{rules.reference_fps:g}" in measured.replace("+", "")
    cited = [mark for mark in ("issue #7074", "arXiv 2603.04379") if mark in source]  # what the docs cite
    assert cited and all(mark in rules.fps_source for mark in cited), (source, rules.fps_source)
    # the streaming example's README gives no rate: it is never cited for one (issue 47)
    assert "README" not in rules.fps_source and "README" not in source


def _model_table(text: str, name: str) -> dict[str, str]:
    """The rows of the `#### name` table in docs/vllm-omni.md's "Each model at a glance"."""
    section = text.split("### Each model at a glance", 1)[1].split("\n### ", 1)[0]
    body = section.split(f"#### {name}\n", 1)[1].split("\n#### ", 1)[0]
    rows = [line.split("|")[1:3] for line in body.splitlines() if line.startswith("| ") and "---" not in line]
    return {key.strip(): value.strip() for key, value in rows if key.strip()}


@pytest.mark.parametrize("rules", model_rules.MODELS, ids=lambda r: r.name)
def test_each_models_table_is_the_rules_tables(rules: model_rules.ModelRules) -> None:
    """One table per model in docs/vllm-omni.md: memory at its cap, fps and source, first chunk,
    the GPU it was validated on, its license; each figure the rules table's."""
    from tests.support.paths import REPO_ROOT

    table = _model_table((REPO_ROOT / "docs" / "vllm-omni.md").read_text(), rules.name)
    assert set(table) == {"memory at its cap", "fps and source", "first chunk", "validated on", "license"}
    assert table["license"].startswith(rules.license.split(" (")[0])
    assert table["validated on"].startswith("not run")  # no GPU has run vLLM-Omni here
    assert f"budget {rules.first_chunk_budget_seconds:g} s" in table["first chunk"]
    assert "not run" in table["first chunk"]
    memory = table["memory at its cap"]
    width, height = rules.default_size
    frames = rules.frame_cap(width, height, presets.DEFAULT_MAX_REQUEST_FRAMES)
    assert f"{rules.weights_bytes / 1e9:.1f} GB" in memory
    if rules.memory is model_rules.MemoryRule.DECODED_HISTORY:
        assert f"{rules.memory_peak_bytes(width, height, frames) / 2**30:.1f} GiB at its peak" in memory
    else:
        assert "no cap from memory" in memory
        assert f"{rules.session_state_bytes / 1e9:.1f} GB a session" in memory
        assert f"{rules.reserved_bytes(width, height, frames, 1, fp8=False) / 1e9:.1f} GB" in memory
        assert f"{rules.reserved_bytes(width, height, frames, 1, fp8=True) / 1e9:.1f} GB with FP8" in memory
    if rules.reference_fps is not None:
        assert f"{rules.reference_fps:g}" in table["fps and source"]
        assert any(
            mark in table["fps and source"] and mark in rules.fps_source for mark in ("issue #7074", "arXiv 2603.04379")
        )
        assert f"Served at {rules.default_fps}" in table["fps and source"]
    else:
        assert "none published" in table["fps and source"]


def test_the_engines_own_warm_up_is_not_a_session_of_the_real_size() -> None:
    """Why the GPU check warms the engine with a real session first (bench_vllm_omni.py,
    `--warmup-chunks`): vLLM-Omni warms up at load with 512x512, 2 steps and no `extra_args`
    (Helios: stage 1, one frame), and LingBot-World skips it (`dummy_run_num_frames = 0`)."""
    engine = wheel_source("vllm_omni/diffusion/diffusion_engine.py")
    dummy = _method(engine, "_dummy_run")
    assert "height=512," in dummy and "width=512," in dummy and "num_inference_steps=2," in dummy
    assert "extra_args" not in dummy
    io_support = wheel_source("vllm_omni/diffusion/io_support.py")
    assert 'return int(getattr(model_cls, "dummy_run_num_frames"))' in io_support
    assert "dummy_run_num_frames: ClassVar[int] = 0" in wheel_source(LINGBOT_PIPELINE)
    assert "dummy_run_num_frames" not in wheel_source(HELIOS_PIPELINE)
