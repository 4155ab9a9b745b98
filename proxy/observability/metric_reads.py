"""Reading current values back out of `prometheus_client` metrics, for tests and status pages.

The library keeps no public getter; the values are read from `collect()`, so they are what a
scrape of `GET /metrics` would show.
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import Counter

__all__ = ["by_label", "samples", "value"]


def samples(metric: Any, suffix: str) -> list[Any]:
    """The samples of `metric`'s family named with `suffix` (`_total`, `_count`, or none)."""
    return [s for family in metric.collect() for s in family.samples if s.name == family.name + suffix]


def value(metric: Any, suffix: str | None = None) -> float:
    """The value of an unlabelled metric (a counter's `_total`, a gauge, or a histogram's `suffix`)."""
    if suffix is None:
        suffix = "_total" if isinstance(metric, Counter) else ""
    return sum(s.value for s in samples(metric, suffix))


def by_label(counter: Counter, label: str) -> Tally:
    """A labelled counter's non-zero values by `label`."""
    return Tally({s.labels[label]: int(s.value) for s in samples(counter, "_total") if s.value})
