"""Settings from text: one declaration per setting, one parser for every place text arrives.

Both settings dataclasses (the proxy's and the model's) declare each setting once with
`setting(default, help)`. Its type annotation decides how text becomes a value, whether
the text comes from a command-line flag, an `RTVIDEO_<NAME>` environment variable or a
Triton model `parameters` entry, so the three cannot parse the same setting differently.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

#: words that turn an optional number off (e.g. `pacing_lead_chunks=off`)
OFF_WORDS = frozenset({"off", "none", "unpaced"})
ENV_PREFIX = "RTVIDEO_"


def setting(default: Any, help: str, *, flag: str | None = None, secret: bool = False, cli: bool = True) -> Any:
    """A dataclass field with its documentation; `flag` overrides the derived `--flag-name`; a
    `secret` one is left out of the dataclass's repr and of the flag's shown default; one with
    `cli=False` has no flag (nor `RTVIDEO_<NAME>`): a figure no operator needs to change, set by
    the code that builds the settings (the tests shorten waits with it)."""
    metadata = {"help": help, "flag": flag, "secret": secret, "cli": cli}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata, repr=not secret)
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def env_name(f: dataclasses.Field) -> str:
    return ENV_PREFIX + f.name.upper()


def _types(cls: type[DataclassInstance]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def parser_for(annotation: Any) -> Callable[[str], Any]:
    """Text → value for one annotated type: int, float, str, bool, `X | None`, `tuple[str, ...]`,
    `int | str` (a number or `auto`)."""
    args = typing.get_args(annotation)
    if type(None) in args:  # optional: "off"/"none" → None, else the inner type
        inner = parser_for(next(a for a in args if a is not type(None)))
        return lambda text: None if text.strip().lower() in OFF_WORDS else inner(text)
    if typing.get_origin(annotation) is tuple:
        return lambda text: tuple(part.strip() for part in text.split(",") if part.strip())
    if set(args) == {int, str}:  # a number, or `auto` (the setting decides what auto is)
        return _int_or_auto
    simple: dict[Any, Callable[[str], Any]] = {
        bool: _parse_bool,
        int: lambda text: int(text.strip()),
        float: _finite_float,
    }
    return simple.get(annotation, lambda text: text.strip())


def _int_or_auto(text: str) -> int | str:
    word = text.strip()
    return "auto" if word.lower() == "auto" else int(word)


def _finite_float(text: str) -> float:
    """A number; `nan` and `inf` are refused, since NaN passes every `<= 0` check (`off` turns
    optional ones off)."""
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean")


def parse(cls: type[DataclassInstance], name: str, text: str, what: str = "setting") -> Any:
    """One setting of `cls` from text; ValueError says which setting and why."""
    try:
        return parser_for(_types(cls)[name])(text)
    except (ValueError, TypeError):
        raise ValueError(f"{what} {name}={text!r} is not a valid value") from None


def from_text(cls: type[T], values: Mapping[str, str], what: str = "setting") -> T:
    """An instance of `cls` from text values; unknown names and bad values raise ValueError
    naming the setting as `what` calls it (e.g. "model parameter")."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what}(s): {', '.join(unknown)}")
    return cls(**{name: parse(cls, name, text, what) for name, text in values.items()})


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[DataclassInstance],
    *,
    skip: tuple[str, ...] = (),
    text_only: bool = False,
) -> None:
    """One flag per field of `cls`, defaulting to `RTVIDEO_<NAME>` when set, else the field's default.

    `text_only`: values stay text (validated as `cls` would parse them) and default to None,
    for settings passed on as text (the model's `parameters`)."""
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata or not f.metadata.get("cli", True):
            continue
        convert = parser_for(_types(cls)[f.name])
        repeatable = typing.get_origin(_types(cls)[f.name]) is tuple  # each use adds to the list

        def checked(
            text: str,
            name: str = f.name,
            convert: Callable[[str], Any] = convert,
            keep_text: bool = text_only and not repeatable,
        ) -> Any:
            try:
                value = convert(text)
            except (ValueError, TypeError):
                origin = f" (from the environment, {text.variable})" if isinstance(text, _FromEnv) else ""
                raise argparse.ArgumentTypeError(f"{name}={str(text)!r} is not a valid value{origin}") from None
            return text.strip() if keep_text else value  # a list stays a tuple: `to_text` joins it

        # A string default goes through `type` too: a bad environment value is a usage error (exit 2).
        default: Any = os.environ.get(env_name(f))
        if default is not None:
            default = _FromEnv(default, env_name(f))
        elif not text_only and f.default is not dataclasses.MISSING:
            default = f.default
        elif not text_only and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        elif not text_only:
            raise TypeError(f"setting {f.name} has no default")  # `setting()` always gives one
        shown = "" if f.metadata.get("secret") or default is None else f" (default: {_show(default)})"
        # a boolean is a switch (`--record-all`) that also takes a value (`--record-all false`)
        switch: dict[str, Any] = {}
        if _types(cls)[f.name] is bool:
            switch = {"nargs": "?", "const": "true" if text_only else True}
        parser.add_argument(
            flag_name(f),
            dest=f.name,
            type=checked,
            default=default,
            **switch,
            action=_Extend if repeatable else "store",
            metavar=f.name.split("_")[-1].upper(),
            help=f"{f.metadata['help']}{shown}",
        )


class _FromEnv(str):
    """A value read from the environment, so that an error can name the variable."""

    variable: str

    def __new__(cls, value: str, variable: str) -> _FromEnv:
        text = super().__new__(cls, value)
        text.variable = variable
        return text


class _Extend(argparse.Action):
    """A repeatable list flag: every use adds its (comma-separated) items to the default's."""

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        current = getattr(ns, self.dest) or ()
        if isinstance(current, str):  # the environment's text, not converted yet
            current = self.type(current) if callable(self.type) else (current,)
        setattr(ns, self.dest, tuple(current) + tuple(values))


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def to_text(value: Any) -> str:
    """A flag's value as a parameter's text (a list comma-separated), as `parser_for` reads it back."""
    return _show(value)


def values_from(ns: argparse.Namespace, cls: type[DataclassInstance]) -> dict[str, Any]:
    """The fields of `cls` that `ns` holds and that were set (not None)."""
    return {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if getattr(ns, f.name, None) is not None}
