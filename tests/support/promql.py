"""A small PromQL reader for the tests of deploy/prometheus and deploy/grafana: it parses the
expressions the rules and the dashboard use (to list the metric names they name) and evaluates
the forms the alert rules use against two scrapes, `before` and `after`, taken as the range.

Supported: selectors with `=`, `!=`, `=~`, `!~` matchers and a range (`[5m]`, its length is the
span between the scrapes); `rate`, `increase`, `irate` over a range (increase = after - before,
a series missing before counts from 0); `sum`, `max`, `min`, `avg` with `by (...)`/`without`;
`histogram_quantile`, `clamp_min` and other calls are parsed, not evaluated; numbers; `+ - * /`
and comparisons (`> < >= <= == !=`, filtering) between vectors with equal label sets or a
vector and a number; parentheses. Precedence as PromQL's: `* /` over `+ -` over comparisons.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Series = dict[str, Vector]  # sample name → its series

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:e[+-]?\d+)?)|(?P<str>\"(?:[^\"\\]|\\.)*\")|(?P<range>\[[^\]]+\])"
    r"|(?P<op>==|!=|>=|<=|=~|!~|[-+*/(){},=<>])|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*))"
)
AGGREGATIONS = {"sum", "max", "min", "avg", "count"}
RANGE_FUNCTIONS = {"rate", "increase", "irate", "delta", "avg_over_time", "max_over_time"}
KEYWORDS = {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool"}


def scrape_series(*texts: str) -> Series:
    """Prometheus text expositions → sample name → {labels: value}."""
    out: Series = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def exported_names(*texts: str) -> set[str]:
    """Every sample name the expositions have or declare (a labelled family with no child yet
    declares its samples by its type)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
    names: set[str] = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            names |= {s.name for s in family.samples}
            names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


@dataclass
class Node:
    kind: str  # num, sel, call, agg, bin
    value: float = 0.0
    name: str = ""
    matchers: list[tuple[str, str, str]] = field(default_factory=list)
    args: list[Node] = field(default_factory=list)
    grouping: tuple[str, tuple[str, ...]] | None = None  # ("by"|"without", labels)

    def names(self) -> set[str]:
        found = {self.name} if self.kind == "sel" else set()
        for arg in self.args:
            found |= arg.names()
        return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos, text = 0, text.strip()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                raise ValueError(f"cannot read {text[pos:]!r}")
            pos = match.end()
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind)))
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise ValueError(f"expected {value!r}, got {token!r}")
        self.i += 1
        return token

    def parse(self) -> Node:
        node = self.comparison()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return node

    def comparison(self) -> Node:
        left = self.additive()
        while (token := self.peek()) and token[1] in ("==", "!=", ">", "<", ">=", "<="):
            self.take()
            left = Node("bin", name=token[1], args=[left, self.additive()])
        return left

    def additive(self) -> Node:
        left = self.multiplicative()
        while (token := self.peek()) and token[1] in ("+", "-"):
            self.take()
            left = Node("bin", name=token[1], args=[left, self.multiplicative()])
        return left

    def multiplicative(self) -> Node:
        left = self.unary()
        while (token := self.peek()) and token[1] in ("*", "/"):
            self.take()
            left = Node("bin", name=token[1], args=[left, self.unary()])
        return left

    def unary(self) -> Node:
        token = self.take()
        kind, value = token
        if kind == "num":
            return Node("num", value=float(value))
        if value == "(":
            inner = self.comparison()
            self.take(")")
            return inner
        if kind != "name":
            raise ValueError(f"unexpected {token!r}")
        if value in AGGREGATIONS:
            grouping = self.grouping()
            self.take("(")
            args = [self.comparison()]
            self.take(")")
            grouping = grouping or self.grouping()
            return Node("agg", name=value, args=args, grouping=grouping)
        if (after := self.peek()) and after[1] == "(":
            self.take("(")
            args = []
            while (self.peek() or ("", ""))[1] != ")":
                args.append(self.comparison())
                if (self.peek() or ("", ""))[1] == ",":
                    self.take(",")
            self.take(")")
            return Node("call", name=value, args=args)
        node = Node("sel", name=value)
        if (after := self.peek()) and after[1] == "{":
            self.take("{")
            while (self.peek() or ("", ""))[1] != "}":
                label = self.take()[1]
                op = self.take()[1]
                text = self.take()[1]
                node.matchers.append((label, op, bytes(text[1:-1], "utf-8").decode("unicode_escape")))
                if (self.peek() or ("", ""))[1] == ",":
                    self.take(",")
            self.take("}")
        if (after := self.peek()) and after[0] == "range":
            self.take()
        return node

    def grouping(self) -> tuple[str, tuple[str, ...]] | None:
        token = self.peek()
        if token is None or token[1] not in ("by", "without"):
            return None
        self.take()
        self.take("(")
        labels: list[str] = []
        while (self.peek() or ("", ""))[1] != ")":
            labels.append(self.take()[1])
            if (self.peek() or ("", ""))[1] == ",":
                self.take(",")
        self.take(")")
        return token[1], tuple(labels)


def parse(text: str) -> Node:
    return _Parser(text).parse()


def metric_names(expressions: Iterable[str]) -> set[str]:
    """The metric names the expressions select."""
    names: set[str] = set()
    for text in expressions:
        names |= parse(text).names()
    return names


def _matches(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    have = dict(labels)
    for label, op, want in matchers:
        value = have.get(label, "")
        ok = {
            "=": value == want,
            "!=": value != want,
            "=~": re.fullmatch(want, value) is not None,
            "!~": re.fullmatch(want, value) is None,
        }[op]
        if not ok:
            return False
    return True


def _select(series: Series, node: Node) -> Vector:
    return {labels: v for labels, v in series.get(node.name, {}).items() if _matches(labels, node.matchers)}


class Evaluator:
    """Evaluates an expression at `after`, with `before` the start of every range."""

    def __init__(self, before: Series, after: Series, seconds: float) -> None:
        self.before, self.after, self.seconds = before, after, seconds

    def __call__(self, text: str) -> Vector:
        result = self.eval(parse(text))
        if isinstance(result, float):
            return {frozenset(): result}
        return result

    def eval(self, node: Node) -> Vector | float:
        if node.kind == "num":
            return node.value
        if node.kind == "sel":
            return _select(self.after, node)
        if node.kind == "call":
            return self.call(node)
        if node.kind == "agg":
            return self.aggregate(node)
        return self.binary(node)

    def call(self, node: Node) -> Vector:
        if node.name not in ("rate", "increase", "irate"):
            raise NotImplementedError(f"{node.name}() is parsed, not evaluated")
        (arg,) = node.args
        now, then = _select(self.after, arg), _select(self.before, arg)
        out: Vector = {}
        for labels, value in now.items():
            increase = value - then.get(labels, 0.0)
            if increase < 0:  # a reset
                increase = value
            out[frozenset((k, v) for k, v in labels if k != "__name__")] = (
                increase if node.name == "increase" else increase / self.seconds
            )
        return out

    def aggregate(self, node: Node) -> Vector:
        (arg,) = node.args
        vector = self.eval(arg)
        assert isinstance(vector, dict), "an aggregation of a number"
        groups: dict[Labels, list[float]] = {}
        for labels, value in vector.items():
            if node.grouping is None:
                key: Labels = frozenset()
            elif node.grouping[0] == "by":
                key = frozenset((k, v) for k, v in labels if k in node.grouping[1])
            else:
                key = frozenset((k, v) for k, v in labels if k not in node.grouping[1])
            groups.setdefault(key, []).append(value)
        reduce = {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v), "count": len}[node.name]
        return {key: float(reduce(values)) for key, values in groups.items()}

    def binary(self, node: Node) -> Vector | float:
        left, right = (self.eval(arg) for arg in node.args)
        op = node.name
        if isinstance(left, float) and isinstance(right, float):
            return _apply(op, left, right) if op in "+-*/" else float(_compare(op, left, right))
        if isinstance(left, float):
            assert isinstance(right, dict)
            pairs = {labels: (left, value) for labels, value in right.items()}
        elif isinstance(right, float):
            pairs = {labels: (value, right) for labels, value in left.items()}
        else:
            pairs = {labels: (value, right[labels]) for labels, value in left.items() if labels in right}
        out: Vector = {}
        for labels, (a, b) in pairs.items():
            if op in ("+", "-", "*", "/"):
                if op == "/" and b == 0:
                    continue  # NaN or Inf: no alert fires on it
                out[labels] = _apply(op, a, b)
            elif _compare(op, a, b):
                out[labels] = left[labels] if isinstance(left, dict) else a
        return out


def _apply(op: str, a: float, b: float) -> float:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]


def _compare(op: str, a: float, b: float) -> bool:
    return {">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b}[op]
