"""The engine adapter only uses what vLLM-Omni's real `AsyncOmni` has.

Read with `ast` from the pinned wheel (nothing of it is imported: it needs vLLM and CUDA):
every method the adapter calls on the engine (`self._engine.X(...)`) must exist in
`AsyncOmni`'s class hierarchy, be async when awaited, take every keyword passed and the
number of positional arguments given; every attribute read must exist; every field the
adapter sets on the engine's sampling params must be a field of
`OmniDiffusionSamplingParams`. The stand-in engine of the other tests must offer the same
calls, so that those tests exercise the adapter as the real engine would.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import rtvideo.backend.vllm_omni as adapter
from tests.support.omni_standin import StandInAsyncOmni, StandInSamplingParams
from tests.support.vllm_omni_wheel import rc_wheel_path, wheel_source

ADAPTER_FILES = sorted(Path(adapter.__file__).parent.glob("*.py"))


def adapter_text() -> str:
    return "\n".join(path.read_text() for path in ADAPTER_FILES)


#: what the adapter uses only on an engine that pauses paced requests (`engine.engine_paces`
#: detects it by these): vLLM-Omni 0.32's, checked against the 0.32.0rc1 wheel, absent from 0.30's
RC_ONLY_CALLS = {"update_streaming_playback"}
RC_ONLY_FIELDS = {"streaming_buffer_seconds", "streaming_max_output_bytes", "streaming_idle_timeout_s"}

CLASSES = {  # AsyncOmni's hierarchy inside the wheel: class -> its file
    "AsyncOmni": "vllm_omni/entrypoints/async_omni.py",
    "AsyncOmniBase": "vllm_omni/entrypoints/async_omni_base.py",
    "OmniBase": "vllm_omni/entrypoints/omni_base.py",
}


@dataclass
class Method:
    is_async: bool
    is_generator: bool
    positional: list[str]  # without self
    keywords: set[str]
    var_positional: bool
    var_keyword: bool


@dataclass
class ClassInfo:
    bases: list[str]
    methods: dict[str, Method] = field(default_factory=dict)
    attributes: set[str] = field(default_factory=set)  # self.X = ... anywhere, class-level annotations


def parse_class(name: str, wheel: Path | None = None) -> ClassInfo:
    tree = ast.parse(wheel_source(CLASSES[name], wheel))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    info = ClassInfo(bases=[b.id for b in node.bases if isinstance(b, ast.Name)])
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = item.args
            positional = [a.arg for a in args.posonlyargs + args.args][1:]
            yields = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(item))
            info.methods[item.name] = Method(
                is_async=isinstance(item, ast.AsyncFunctionDef),
                is_generator=yields,
                positional=positional,
                keywords={a.arg for a in args.args[1:] + args.kwonlyargs},
                var_positional=args.vararg is not None,
                var_keyword=args.kwarg is not None,
            )
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            info.attributes.add(item.target.id)
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    info.attributes.add(target.attr)
    return info


def class_chain(wheel: Path | None = None) -> list[ClassInfo]:
    """AsyncOmni, then its bases, in method-resolution order (single inheritance inside the wheel)."""
    chain, name = [], "AsyncOmni"
    while name in CLASSES:
        info = parse_class(name, wheel)
        chain.append(info)
        name = next((b for b in info.bases if b in CLASSES), "")
    assert [c for c in CLASSES] == ["AsyncOmni", "AsyncOmniBase", "OmniBase"] and len(chain) == 3
    return chain


@pytest.fixture(scope="module")
def real() -> list[ClassInfo]:
    return class_chain()


@pytest.fixture(scope="module")
def real_rc() -> list[ClassInfo]:
    return class_chain(rc_wheel_path())


def lookup(chain: list[ClassInfo], name: str) -> Method | None:
    return next((c.methods[name] for c in chain if name in c.methods), None)


def is_engine(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "_engine"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def adapter_uses() -> tuple[list[tuple[str, int, set[str], bool, int]], set[str], set[str]]:
    """(method, positional count, keywords, awaited, line) per engine call; attributes read; params fields set."""
    tree = ast.parse(adapter_text())
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    calls, reads, params_fields = [], set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_engine(node.value):
            parent = parents[node]
            if isinstance(parent, ast.Call) and parent.func is node:
                awaited = any(
                    isinstance(p, (ast.Await, ast.AsyncFor))
                    for p in (parents.get(parent), parents.get(parents.get(parent)))
                )
                calls.append(
                    (node.attr, len(parent.args), {k.arg for k in parent.keywords if k.arg}, awaited, node.lineno)
                )
            else:
                reads.add(node.attr)
        # fields set on the sampling params built in _sampling_params: `params.X = ...`
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "params"
            and isinstance(node.ctx, ast.Store)
        ):
            params_fields.add(node.attr)
    return calls, reads, params_fields


def test_the_adapter_calls_only_what_asyncomni_has(real: list[ClassInfo], real_rc: list[ClassInfo]) -> None:
    calls, reads, _ = adapter_uses()
    assert {name for name, *_ in calls} >= {"generate", "submit_interaction_async", "abort", "check_health", "shutdown"}
    assert {name for name, *_ in calls} >= RC_ONLY_CALLS
    for name in RC_ONLY_CALLS:  # so the adapter detects them rather than calling them on 0.30
        assert lookup(real, name) is None, f"{name}() is in 0.30 too: RC_ONLY_CALLS is out of date"
    for name, n_positional, keywords, awaited, line in calls:
        method = lookup(real_rc if name in RC_ONLY_CALLS else real, name)
        assert method is not None, f"line {line}: AsyncOmni has no method {name}()"
        unknown = keywords - method.keywords
        assert not unknown or method.var_keyword, f"line {line}: {name}() has no keyword(s) {sorted(unknown)}"
        assert n_positional <= len(method.positional) or method.var_positional, f"line {line}: {name}() positional"
        if name == "generate":
            assert method.is_async and method.is_generator, "generate() is consumed with async for"
        elif awaited:
            assert method.is_async and not method.is_generator, f"line {line}: {name}() is awaited but not a coroutine"
        else:
            assert not method.is_async, f"line {line}: {name}() is async but not awaited"
    attributes = set().union(*(c.attributes for c in real))
    for name in reads:
        assert name in attributes or lookup(real, name) is not None, f"AsyncOmni has no attribute {name}"


def test_the_adapter_constructs_the_engine_as_asyncomni_takes_it(real: list[ClassInfo]) -> None:
    init = lookup(real, "__init__")
    assert init is not None and "model" in init.keywords and init.var_keyword  # model=..., **engine_args
    source = adapter_text()
    assert "self._factory(model=self._model, **self._engine_args)" in source


def test_sampling_params_fields_exist() -> None:
    tree = ast.parse(wheel_source("vllm_omni/inputs/data.py"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OmniDiffusionSamplingParams")
    fields = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    _, _, params_fields = adapter_uses()
    assert params_fields >= RC_ONLY_FIELDS and not RC_ONLY_FIELDS & fields
    params_fields -= RC_ONLY_FIELDS
    assert params_fields and params_fields <= fields, params_fields - fields
    assert params_fields <= set(StandInSamplingParams.__dataclass_fields__)
    rc_tree = ast.parse(wheel_source("vllm_omni/inputs/data.py", rc_wheel_path()))
    rc_node = next(n for n in rc_tree.body if isinstance(n, ast.ClassDef) and n.name == "OmniDiffusionSamplingParams")
    rc_fields = {n.target.id for n in rc_node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert rc_fields >= RC_ONLY_FIELDS


def test_interaction_payload_matches_omni_interaction_prompt() -> None:
    tree = ast.parse(wheel_source("vllm_omni/inputs/data.py"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OmniInteractionPrompt")
    keys = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert keys == {"event_id", "event", "transition_chunks"}
    assert '{"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": n}' in adapter_text()


def test_the_stand_in_offers_the_same_calls() -> None:
    calls, reads, _ = adapter_uses()
    for name, n_positional, keywords, _, _line in calls:
        if name in RC_ONLY_CALLS:  # 0.30's shape; the 0.32 one: test_vllm_omni_engine_pacing.py
            continue
        member = getattr(StandInAsyncOmni, name, None)
        assert callable(member), f"the stand-in lacks {name}()"
        signature = inspect.signature(member)
        signature.bind(None, *range(n_positional), **dict.fromkeys(keywords))  # raises if it cannot take them
    engine = StandInAsyncOmni.__new__(StandInAsyncOmni)
    StandInAsyncOmni.__init__(engine, model="m")
    for name in reads:
        assert hasattr(engine, name), name
