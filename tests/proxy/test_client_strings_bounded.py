"""Client-chosen strings are bounded at every sink (issue 20, class 5): a 5 MB model name, many
distinct model names, a lone surrogate, long break records and long log arguments leave
``/metrics``, OTel, the ledger and the log small. The helper is
:mod:`prefixgate.proxy.core.bounded`; the sinks are ``observe/metrics.py``, ``observe/otel.py``,
``ProxyState.record`` (every row) and ``core/logsafe.SafeFormatter``."""

from __future__ import annotations

import logging
import random
from dataclasses import fields
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.loader import parse_policy
from prefixgate.config.prices import PRICES
from prefixgate.proxy.core.bounded import (
    LABEL_CHARS,
    LOG_ARG_CHARS,
    LOG_MESSAGE_CHARS,
    ROW_CHARS,
    clip,
    clip_fields,
    clip_strings,
    encodable,
)
from prefixgate.proxy.core.logsafe import SafeFormatter
from prefixgate.proxy.observe.metrics import (
    MAX_LABEL_SETS,
    OTHER,
    LabelGuard,
    ProxyMetrics,
    label_vocabulary,
    price_family,
)
from tests.proxy.upstream import Script, completion, wait_rows

MB5 = 5 * 1024 * 1024


def chat(url: str, model: str, session: str = "s1", system: str = "Be terse.") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": "hello"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"x-prefixgate-session": session})


def model_labels(text: str) -> set[str]:
    return {s.labels["model"] for fam in text_string_to_metric_families(text)
            for s in fam.samples if "model" in s.labels}


# -- the helper ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 39, 40, 41, 127, 128, 129, 1000, 10_000, 123_457])
@pytest.mark.parametrize("limit", [0, 5, 39, 40, 41, 128, 256, 1000])
def test_clip_never_exceeds_its_limit_and_keeps_short_text(n: int, limit: int) -> None:
    text = "é" * n
    out = clip(text, limit)
    assert len(out) <= limit
    if n <= limit:
        assert out == text
    else:
        assert out != text and text.startswith(out[:min(limit, 20) // 2])


def test_clip_keeps_distinct_long_names_distinct_and_is_deterministic() -> None:
    a, b = "gpt-4o-" + "a" * 10_000, "gpt-4o-" + "a" * 9_999 + "b"
    assert clip(a, 256) == clip(a, 256)
    assert clip(a, 256) != clip(b, 256)
    assert clip(a, 256).startswith("gpt-4o-aaa")
    assert "+" in clip(a, 256) and "chars #" in clip(a, 256)


def test_encodable_replaces_lone_surrogates_only() -> None:
    assert encodable("m\ud800x") == "m\ufffdx"
    assert encodable("mé😀") == "mé😀"
    encodable("\udfff" * 3).encode("utf-8")


def test_every_text_column_of_a_row_is_bounded() -> None:
    """A new text column of LedgerRow must be added to ROW_CHARS (or be pass_tokens, the
    proxy's own JSON): no column can hold a client's string unbounded."""
    text_cols = {f.name for f in fields(LedgerRow) if f.type in ("str", str)}
    assert text_cols - set(ROW_CHARS) == {"pass_tokens"}
    row = LedgerRow(**{c: "x\ud800" * 500_000 for c in ROW_CHARS})
    clip_fields(row)
    for c, limit in ROW_CHARS.items():
        value = getattr(row, c)
        assert len(value) <= limit, c
        value.encode("utf-8")


def test_break_record_strings_are_clipped_keys_and_nested_included() -> None:
    huge = "m" * MB5
    rec = {"kind": "model_changed", "detail": f"model {huge!r} -> {huge!r}", huge: 1,
           "nested": [{"excerpt": huge}], "n": 7}
    out = clip_strings(rec, 1000)
    assert len(repr(out)) < 5000
    assert out["kind"] == "model_changed" and out["n"] == 7


# -- /metrics -----------------------------------------------------------------------------------

def test_five_mb_model_name_leaves_metrics_small_and_the_row_clipped(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    assert chat(rig.url, "m").status_code == 200
    wait_rows(rig.ledger, 1)
    before = len(httpx.get(rig.url + "/metrics").content)
    huge = "m" + "x" * MB5
    assert chat(rig.url, huge).status_code == 200  # route m* matches it
    assert chat(rig.url, "zzz" + "y" * MB5).status_code == 404  # no route: ModelNotFound
    rows = wait_rows(rig.ledger, 3)
    after = httpx.get(rig.url + "/metrics")
    # one new route/status combination at most; the 5 MB name itself adds nothing
    assert len(after.content) < before + 40_000, (before, len(after.content))
    assert model_labels(after.text) <= {OTHER}
    assert max(len(v) for v in model_labels(after.text)) <= LABEL_CHARS
    for row in rows:
        assert len(row["model"]) <= ROW_CHARS["model"]
    assert rows[1]["model"].startswith("mxxx") and rows[1]["model"] == clip(huge, 256)
    assert rows[1]["status"] == "ok"


def test_lone_surrogate_model_keeps_its_row_and_metrics_scrape(rig: Any) -> None:
    """Not in the issue: ``"\\ud800"`` is valid JSON but not UTF-8 (SQLite and the Prometheus
    text format cannot encode it). The body check refuses it today; whichever path lets one
    through later, the row stays writable (``encodable``, unit tests above) and /metrics scrapes."""
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   content=b'{"model": "m\\ud800", "messages": [{"role": "user", "content": "x"}]}',
                   headers={"content-type": "application/json"})
    assert r.status_code in (200, 400), r.text
    rows = wait_rows(rig.ledger, 1)
    assert rows[0]["model"] in ("m\ufffd", "")
    m = httpx.get(rig.url + "/metrics")
    assert m.status_code == 200


def test_break_record_of_two_long_model_names_is_clipped(rig: Any) -> None:
    """Not in the issue: a ``model_changed`` break quotes both model names in its detail."""
    rig.upstream.script = Script(body=completion())
    long = "Follow the airline policy exactly and check the booking before any change. " * 20
    a, b = "m" + "a" * 1_000_000, "m" + "b" * 1_000_000
    assert chat(rig.url, a, system=long).status_code == 200
    assert chat(rig.url, b, system=long).status_code == 200
    wait_rows(rig.ledger, 2)
    breaks = rig.ledger.breaks()
    assert breaks and breaks[-1]["kind"] == "model_changed"
    assert len(repr(breaks)) < 10_000


def test_many_distinct_model_names_give_a_bounded_label_set() -> None:
    policy = parse_policy({
        "backends": {"up": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"match": "gpt-*", "backend": "up"}, {"match": "fast", "backend": "up",
                                                         "model": "gpt-4o-mini"},
                   {"match": "*", "backend": "up"}],
        "aliases": {"quick": "gpt-4.1-nano"}})
    vocab = label_vocabulary(policy)
    assert vocab == ["fast", "gpt-4.1-nano", "gpt-4o-mini", "quick"]
    m = ProxyMetrics(vocab)
    rnd = random.Random(7)
    sizes = []
    for i in range(3000):
        route = rnd.choice(["gpt-*", "*", ""])
        model = rnd.choice([f"gpt-4o-{i}", f"gpt-{rnd.random()}", "x" * rnd.randint(1, 300),
                            "gpt-4o-2024-08-06", "claude-sonnet-4-5-20250929", "fast"])
        m.observe(LedgerRow(route=route, model=model, backend="up", prompt_tokens=1,
                            ttft_ms=5.0, total_ms=9.0))
        if i in (500, 2999):
            sizes.append(len(m.render().splitlines()))
    labels = model_labels(m.render().decode())
    allowed = set(vocab) | set(PRICES) | {OTHER}
    assert labels <= allowed, labels - allowed
    assert labels == {OTHER, "gpt-4o", "claude-sonnet-4-5", "fast"}
    assert sizes[0] == sizes[1]  # 2500 more distinct names added no series
    assert len(m.guard._seen) <= MAX_LABEL_SETS


def test_label_guard_vocabulary_price_family_and_set_cap() -> None:
    g = LabelGuard(models=["gpt-4o", "m", "y" * 200], max_sets=6)
    assert g.labels("gpt-*", "gpt-4o", "up") == ("gpt-*", "gpt-4o", "up")
    assert g.labels("m*", "m", "up")[1] == "m"                  # the policy names it
    assert g.labels("m*", "m1", "up")[1] == OTHER               # a glob match, not a known id
    assert g.labels("*", "gpt-4.1-2025-04-14", "up")[1] == "gpt-4.1"  # dated snapshot -> id
    assert g.labels("*", "gpt-4o-anything", "up")[1] == OTHER   # exact ids only, not prefixes
    assert g.labels("", "gpt-4o-mini", "")[0:2] == ("none", OTHER)  # no route matched
    assert g.labels("*", "y" * 200, "up")[1] == OTHER            # over LABEL_CHARS: never kept
    assert g.labels("x*", "x", "b") == (OTHER, OTHER, OTHER)     # seventh label set: capped
    assert g.labels("gpt-*", "gpt-4o", "up") == ("gpt-*", "gpt-4o", "up")
    assert price_family("o4-mini-latest") == "o4-mini"
    assert price_family("anthropic/claude-3.5-sonnet-20241022") == "claude-3-5-sonnet"
    assert price_family("gpt-4o" + "-2024-08-06" * 20) is None


# -- logs ---------------------------------------------------------------------------------------

def _record(msg: str, args: Any) -> logging.LogRecord:
    return logging.LogRecord("prefixgate.proxy", logging.WARNING, __file__, 1, msg, args, None)


def test_log_lines_are_bounded_whatever_the_call_site_forgot() -> None:
    fmt = SafeFormatter("%(levelname)s %(name)s %(message)s")
    huge = "m\n" * MB5
    line = fmt.format(_record("model %s tenant %s", (huge, "acme")))
    assert len(line) < 2 * LOG_ARG_CHARS + 200 and "tenant acme" in line and "\n" not in line
    line = fmt.format(_record(f"unrouted model {huge}", ()))  # an f-string: one long message
    assert len(line) < 2 * LOG_MESSAGE_CHARS + 200 and "\n" not in line
    line = fmt.format(_record("%(model)s", ({"model": huge},)))
    assert len(line) < 2 * LOG_ARG_CHARS + 200
    try:
        raise ValueError(f"bad model {huge}")
    except ValueError:
        import sys
        rec = _record("failed", ())
        rec.exc_info = sys.exc_info()
        assert len(fmt.format(rec)) < 2 * LOG_MESSAGE_CHARS + 2000
