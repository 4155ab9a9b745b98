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

from rtvideo.backend.loading import catalog
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni import interaction_rules, model_rules
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
    assert HELIOS_DISTILLED.largest_frames(1456) == 1452 == catalog.DEFAULT_MAX_REQUEST_FRAMES
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
    assert LINGBOT_WORLD.memory_cap(832, 480) == 885  # 4 GiB / (832 x 480 x 12 B) = 896, down to 12k + 9
    assert [LINGBOT_WORLD.request_frames(n, 885) for n in (1, 9, 10, 21, 22, 5000)] == [9, 9, 21, 21, 33, 885]
    sources = EngineSources(None, {}, 3600.0, None, max_request_frames=1452, rules=LINGBOT_WORLD)  # type: ignore[arg-type]
    config = resolve_session_config(
        validate_start(check_first_message(json.dumps(_start(image=True)))), _lingbot().capabilities("m")
    )
    assert config.num_frames == 885 and sources.engine_frames(config) == 885


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
    cited = [mark for mark in ("issue #7074", "README") if mark in source]  # what the docs cite
    assert cited and all(mark in rules.fps_source for mark in cited), (source, rules.fps_source)
