"""Prometheus view of speculative decoding, named after vLLM's ``spec_decode`` metrics.

Read from ``engine.stats()`` at scrape time (keys written by ``spec.decode.SpecMetrics.as_dict``);
nothing is exported while speculation is off.

=====================================================  =======  ===============================
name                                                   type     meaning
=====================================================  =======  ===============================
``engine_spec_decode_num_drafts_total``                counter  drafts verified
``engine_spec_decode_num_draft_tokens_total``          counter  draft tokens proposed
``engine_spec_decode_num_accepted_tokens_total``       counter  draft tokens accepted
``engine_spec_decode_num_accepted_tokens_per_pos_total``  counter  accepted, by draft position
``{position}``
``engine_spec_decode_mean_accepted_length``            gauge    1 + accepted / drafts (tokens
                                                                per drafted request-step)
``engine_spec_decode_draft_acceptance_rate``           gauge    accepted / proposed (0..1)
``engine_spec_decode_no_draft_share``                  gauge    decode request-steps without a
                                                                draft / all (0..1)
``engine_spec_suffix_index_bytes``                     gauge    bytes the suffix index holds
                                                                (with ``suffix`` drafting)
``engine_spec_suffix_namespaces``                      gauge    cache_salt namespaces it holds
=====================================================  =======  ===============================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_COUNTERS = (
    ("engine_spec_decode_num_drafts", "Speculative drafts verified.", "spec_num_drafts"),
    ("engine_spec_decode_num_draft_tokens", "Draft tokens proposed.", "spec_num_draft_tokens"),
    ("engine_spec_decode_num_accepted_tokens", "Draft tokens accepted.",
     "spec_num_accepted_tokens"),
)
POS_PREFIX = "spec_accepted_pos_"


class SpecCollector(Collector):
    """Yields the spec-decode families from ``stats()`` (none when its keys are absent)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if "spec_num_drafts" not in s:
            return
        for name, doc, key in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(s[key]))
        per_pos = CounterMetricFamily("engine_spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted, by position in the draft.",
                                      labels=["position"])
        for key, value in s.items():
            if key.startswith(POS_PREFIX):
                per_pos.add_metric([key[len(POS_PREFIX):]], float(value))
        yield per_pos
        yield GaugeMetricFamily("engine_spec_decode_mean_accepted_length",
                                "1 + accepted / drafts (tokens per drafted request-step).",
                                value=float(s["spec_mean_accepted_len"]))
        yield GaugeMetricFamily("engine_spec_decode_draft_acceptance_rate",
                                "Accepted / proposed draft tokens (0..1).",
                                value=float(s["spec_acceptance_rate"]))
        if "spec_suffix_index_bytes" in s:
            yield GaugeMetricFamily("engine_spec_suffix_index_bytes",
                                    "Bytes the suffix drafter's index holds.",
                                    value=float(s["spec_suffix_index_bytes"]))
            yield GaugeMetricFamily("engine_spec_suffix_namespaces",
                                    "cache_salt namespaces the suffix drafter's index holds.",
                                    value=float(s["spec_suffix_namespaces"]))
        steps = float(s.get("spec_decode_steps") or 0)
        yield GaugeMetricFamily("engine_spec_decode_no_draft_share",
                                "Decode request-steps without a draft / all (0..1).",
                                value=float(s.get("spec_no_draft_steps", 0)) / steps if steps else 0.0)
