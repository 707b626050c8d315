"""``/metrics`` after real traffic through the proxy, parsed with prometheus-client's parser:
route / model / backend labels, tokens by kind, cost, cache breaks, proxy overhead; and the
label bounds and money arithmetic of :mod:`prefixgate.proxy.observe.metrics` on their own."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.prices import price_for
from prefixgate.proxy.observe.metrics import OTHER, LabelGuard, ProxyMetrics, RequestObs
from tests.proxy.upstream import DONE, Script, chunk, completion, wait_rows

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``/metrics`` as ``{(name, labels): value}``."""
    text = httpx.get(url + "/metrics").text
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None when there is none)."""
    hits = [v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= lab]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0] if hits else None


def chat(url: str, model: str, system: str = "You are terse.", stream: bool = False,
         session: str = "s1") -> httpx.Response:
    body: dict[str, Any] = {"model": model, "stream": stream, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hello there"}]}
    return httpx.post(url + "/v1/chat/completions", json=body,
                      headers={"x-prefixgate-session": session})


def test_labels_tokens_cost_and_overhead_after_traffic(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())  # prompt 10, cached 4, output 2
    assert chat(rig.url, "gpt-4o").status_code == 200
    rig.upstream.script = Script(pieces=[chunk("he"), chunk("llo"), chunk(finish="stop"),
                                         chunk(usage={"prompt_tokens": 7, "completion_tokens": 2}),
                                         DONE])
    assert chat(rig.url, "m", stream=True).status_code == 200
    wait_rows(rig.ledger, 2)
    s = scrape(rig.url)
    gpt = {"route": "gpt-*", "model": "gpt-4o", "backend": "up"}
    assert value(s, "prefixgate_requests_total", status="ok", **gpt) == 1
    # "m" matched the glob m*; the policy does not name it: "other" (issue 20, class 5)
    assert value(s, "prefixgate_requests_total", status="ok", route="m*", model=OTHER) == 1
    assert value(s, "prefixgate_tokens_total", kind="prompt", **gpt) == 10
    assert value(s, "prefixgate_tokens_total", kind="cached", **gpt) == 4
    assert value(s, "prefixgate_tokens_total", kind="output", **gpt) == 2
    assert value(s, "prefixgate_tokens_total", kind="cache_write", **gpt) is None  # unreported
    assert value(s, "prefixgate_tokens_total", kind="prompt", route="m*", model=OTHER) == 7
    price = price_for("gpt-4o")
    assert price is not None
    want_in = (6 * price.input + 4 * price.cached_input) / 1e6
    assert value(s, "prefixgate_cost_usd_total", kind="input", **gpt) == pytest.approx(want_in)
    assert value(s, "prefixgate_cost_usd_total", kind="output", **gpt) == pytest.approx(
        2 * price.output / 1e6)
    # one overhead observation per request that reached the send, per route
    assert value(s, "prefixgate_proxy_overhead_seconds_count", route="gpt-*") == 1
    assert value(s, "prefixgate_proxy_overhead_seconds_count", route="m*") == 1
    assert value(s, "prefixgate_ttft_seconds_count", route="m*", model=OTHER) == 1
    # the pre-existing names still answer, now with route and model labels too
    assert value(s, "prefixgate_cached_tokens_total", **gpt) == 4


def test_unrouted_model_is_other_and_counts_no_overhead(rig: Any) -> None:
    assert chat(rig.url, "zzz-no-route").status_code == 404
    wait_rows(rig.ledger, 1)
    s = scrape(rig.url)
    assert value(s, "prefixgate_requests_total", model=OTHER, route="none",
                 status="ModelNotFound") == 1
    assert value(s, "prefixgate_proxy_overhead_seconds_count") is None


def test_cache_break_counted_by_kind(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    long = "Follow the airline policy exactly and check the booking before any change. " * 20
    assert chat(rig.url, "m", system=long + "Version one.").status_code == 200
    assert chat(rig.url, "m", system=long + "Second edition.").status_code == 200
    wait_rows(rig.ledger, 2)
    s = scrape(rig.url)
    assert value(s, "prefixgate_cache_breaks_total", kind="system_edit", route="m*") == 1


def test_label_guard_bounds_models_to_the_vocabulary_and_label_sets() -> None:
    """The model label is a policy name, a price-table id, or ``other`` (issue 20, class 5;
    more cases in tests/proxy/test_client_strings_bounded.py)."""
    g = LabelGuard(models=["gpt-4o"], max_sets=4)
    assert g.labels("gpt-*", "gpt-4o", "up") == ("gpt-*", "gpt-4o", "up")
    assert g.labels("m*", "m1", "up")[1] == OTHER       # a glob match the policy does not name
    assert g.labels("*", "gpt-5-mini", "up")[1] == "gpt-5-mini"  # a price-table id
    assert g.labels("", "anything", "")[0:2] == ("none", OTHER)  # no route matched
    assert g.labels("x*", "x", "b") == (OTHER, OTHER, OTHER)     # fifth label set: capped
    assert g.labels("gpt-*", "gpt-4o", "up") == ("gpt-*", "gpt-4o", "up")


def test_savings_and_overspend_are_separate_monotonic_counters() -> None:
    m = ProxyMetrics(["gpt-4o"])
    base = {"route": "gpt-*", "model": "gpt-4o", "backend": "up", "prompt_tokens": 100}
    m.observe(LedgerRow(**base, input_usd=1.0, cf_input_usd=1.5),
              RequestObs(break_kind="reorder", read_done=1.0, sent_at=1.004))
    m.observe(LedgerRow(**base, input_usd=2.0, cf_input_usd=1.75))
    m.observe(LedgerRow(**base, input_usd=3.0))  # no counterfactual: neither counter moves
    text = m.render().decode()
    s: Samples = {(x.name, frozenset(x.labels.items())): x.value
                  for f in text_string_to_metric_families(text) for x in f.samples}
    assert value(s, "prefixgate_saved_usd_total") == pytest.approx(0.5)
    assert value(s, "prefixgate_overspent_usd_total") == pytest.approx(0.25)
    assert value(s, "prefixgate_unrewritten_input_cost_usd_total") == pytest.approx(3.25)
    assert value(s, "prefixgate_cost_usd_total", kind="input") == pytest.approx(6.0)
    assert value(s, "prefixgate_cache_breaks_total", kind="reorder") == 1
    assert value(s, "prefixgate_proxy_overhead_seconds_sum") == pytest.approx(0.004)


def test_kept_label_children_count_each_label_set_apart_and_stay_bounded() -> None:
    """The children kept per label set (``ProxyMetrics._of``) add up as the registry's own:
    each set its own series, a repeated set the same one; client-chosen model names beyond the
    label cap all land in ``other`` and keep no child of their own."""
    m = ProxyMetrics(["gpt-4o"], max_label_sets=3)
    rows = [LedgerRow(route="gpt-*", model="gpt-4o", backend="up", status="ok", prompt_tokens=10),
            LedgerRow(route="gpt-*", model="gpt-4o", backend="up", status="ok", prompt_tokens=5),
            LedgerRow(route="gpt-*", model="gpt-4o", backend="up", status="x", prompt_tokens=1),
            LedgerRow(route="o*", model="o1", backend="b2", status="ok", prompt_tokens=7)]
    rows += [LedgerRow(route=f"r{i}", model=f"client-{i}", backend="up", status="ok",
                       prompt_tokens=1) for i in range(50)]
    for r in rows:
        m.observe(r)
    s: Samples = {(x.name, frozenset(x.labels.items())): x.value
                  for f in text_string_to_metric_families(m.render().decode()) for x in f.samples}
    assert value(s, "prefixgate_requests_total", model="gpt-4o", status="ok") == 2
    assert value(s, "prefixgate_requests_total", model="gpt-4o", status="x") == 1
    assert value(s, "prefixgate_prompt_tokens_total", model="gpt-4o") == 16
    assert value(s, "prefixgate_prompt_tokens_total", route="o*", backend="b2") == 7
    assert value(s, "prefixgate_prompt_tokens_total", route=OTHER, model=OTHER) == 49
    assert value(s, "prefixgate_prompt_tokens_total", route="r0") == 1
    kept = [values for _, values in m._children]
    assert {v[:3] for v in kept} == {("gpt-*", "gpt-4o", "up"), ("o*", OTHER, "b2"),
                                     ("r0", OTHER, "up"), (OTHER, OTHER, OTHER)}  # cap + other


def test_no_info_log_line_per_request(rig: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="prefixgate")
    rig.upstream.script = Script(body=completion())
    assert chat(rig.url, "m").status_code == 200
    wait_rows(rig.ledger, 1)
    # the access line (prefixgate.access, one per request by design: `serve --no-access-log`
    # turns it off) is written after the ledger row, so it may or may not be here yet
    assert not [r for r in caplog.records if r.name.startswith("prefixgate")
                and r.name != "prefixgate.access" and r.levelno >= logging.INFO], caplog.text
