"""Reading the dashboard back out of a live page (tests and ``bench/dashboard_screenshot.py``).

- :func:`shown_numbers` — every ``[data-key]`` element's key, format and text.
- :func:`number_mismatches` — where the shown text is not the payload's value (within the
  format's rounding: 4 decimals for USD, 1 for percent and ms, whole tokens), or where a
  ``null`` is not shown as "not reported" (and the reverse).
- :func:`expected_keys` — the keys the page must show for a payload (every total, every row of
  every table), so a page that shows nothing cannot pass.
- :func:`canvas_report` — per uPlot chart: canvas size, non-blank pixels, and pixels in one of
  its data series' colours (a drawn line / area / bar, not only axes and grid).
"""

from __future__ import annotations

from typing import Any

from tests.browser import Page

NOT_REPORTED = "not reported"
# half a unit of the last digit shown (pct: the share is shown as percent with 1 decimal)
TOLERANCE = {"usd": 0.00005, "int": 0.5, "pct": 0.0005, "ms": 0.05, "s": 0.05, "rate": 0.0005}

READ_NUMBERS_JS = """[...document.querySelectorAll('[data-key]')]
  .map(e => [e.dataset.key, e.dataset.fmt, e.textContent.replace(/\u00a0/g, " ")])"""

CANVAS_JS = """Object.entries(window.dash.charts).map(([id, u]) => {
  const c = u.ctx.canvas, d = u.ctx.getImageData(0, 0, c.width, c.height).data;
  const cols = window.dash.colors[id].map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
  let nonblank = 0, series = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] === 0) continue;
    nonblank++;
    if (d[i + 3] > 250 && cols.some(([r, g, b]) =>
        Math.abs(d[i] - r) <= 6 && Math.abs(d[i + 1] - g) <= 6 && Math.abs(d[i + 2] - b) <= 6)) series++;
  }
  return {id, width: c.width, height: c.height, nonblank, series};
})"""


def shown_numbers(page: Page) -> list[tuple[str, str, str]]:
    """``(key, fmt, text)`` for every number / label the page shows from the payload."""
    return [tuple(x) for x in page.evaluate(READ_NUMBERS_JS)]  # type: ignore[misc]


def lookup(payload: Any, key: str) -> Any:
    """``payload`` at dotted ``key`` (list indices as numbers: ``routes.0.model``); None when a
    step is null or absent (the page shows "not reported" for both)."""
    node = payload
    for part in key.split("."):
        if isinstance(node, list):
            node = node[int(part)] if int(part) < len(node) else None
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def parse_shown(fmt: str, text: str) -> Any:
    """The value behind ``text`` as the page formats ``fmt`` (None for "not reported")."""
    if text == NOT_REPORTED:
        return None
    if fmt == "text":
        return text
    t = text.replace(",", "").replace("$", "").replace("%", "").replace(" ms/token", "")
    t = t.replace(" ms", "").replace(" s", "").strip()
    value = float(t)
    return value / 100 if fmt == "pct" else value


def number_mismatches(payload: dict[str, Any], shown: list[tuple[str, str, str]]) -> list[str]:
    """Human-readable differences between what the page shows and ``payload``."""
    out = []
    for key, fmt, text in shown:
        want = lookup(payload, key)
        got = parse_shown(fmt, text)
        if want is None or got is None or fmt == "text":
            if want != got:
                out.append(f"{key}: page {text!r}, payload {want!r}")
        elif abs(float(got) - float(want)) > TOLERANCE[fmt] + 1e-9:
            out.append(f"{key}: page {text!r}, payload {want!r}")
    return out


def expected_keys(payload: dict[str, Any]) -> set[str]:
    """Keys the page must show for ``payload``."""
    keys = {f"totals.{k}" for k in ("requests", "errors", "input_usd", "saved_usd",
                                    "prompt_tokens", "cached_tokens", "saved_tokens",
                                    "pruned_tokens", "cached_share", "cf_cached_share",
                                    "ttft_p50_ms", "no_usage_reported")}
    if payload["totals"].get("cf_input_usd") is not None:  # unpriced: "no priced request" instead
        keys |= {"totals.cf_input_usd", "totals.saved_pct"}
    keys |= {k for k in ("totals.ttft_p95_ms", "totals.cache_write_premium_usd", "totals.prefill_s_saved",
                         "totals.prefill_s_cached") if k.split(".")[1] in payload["totals"]}
    keys |= {f"totals.cf_source.{k}" for k in ("measured", "modelled", "holdout", "none")}
    tables = {"by_technique": ("technique", "tokens_reusable", "tokens_removed", "tokens_added", "usd"),
              "breaks": ("field", "token_offset", "tokens_lost", "count"),
              "slo": ("route", "ttft_ms", "tpot_ms", "ttft_attainment", "tpot_attainment", "goodput"),
              "routes": ("route", "model", "backend", "requests", "errors", "cached_share",
                         "saved_usd", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms"),
              "guard": ("route", "tenant", "move", "state", "pairs", "move_rate", "floor_rate")}
    for name, fields in tables.items():
        for i in range(len(payload.get(name) or [])):
            keys |= {f"{name}.{i}.{f}" for f in fields}
    top = payload.get("top_break")
    if top:  # the first card: cause, masked line, where, cost, fix (issue 37)
        keys |= {f"top_break.{f}" for f in ("cause", "where", "token_offset", "unit_text",
                                            "tokens_lost", "count", "fix_note")}
        keys |= {f"top_break.{f}" for f in ("excerpt", "fix") if top.get(f)}
        keys |= {f"top_break.{f}" for f in ("seconds_lost", "usd_lost") if top.get(f) is not None}
    for i, b in enumerate(payload.get("breaks") or []):
        keys |= {f"breaks.{i}.{f}" for f in ("cause", "excerpt", "fix", "fix_note") if f in b}
    for i, r in enumerate(payload.get("routes") or []):  # the time columns, where the API has them
        keys |= {f"routes.{i}.{f}" for f in ("prefill_ms_per_token", "prefill_s_saved") if f in r}
        if any(x.get("pd") for x in payload["routes"]):  # a P/D backend: the split share column
            keys.add(f"routes.{i}.pd_split_share")
    holdout = payload.get("holdout") or {}
    if holdout.get("enabled"):
        keys.add("holdout.verdict")
        if holdout.get("reason"):
            keys.add("holdout.reason")
        if holdout.get("overall"):
            keys |= {f"holdout.overall.{f}" for f in ("n_rewritten", "n_holdout", "verdict")}
        for i in range(len(holdout.get("buckets") or [])):
            keys |= {f"holdout.buckets.{i}.{f}" for f in ("n_rewritten", "n_holdout", "verdict")}
            keys |= {f"holdout.buckets.{i}.{m}.{s}" for m in ("cached_share", "ttft_p50_ms")
                     for s in ("rewritten", "holdout", "diff")}
    return keys


def canvas_report(page: Page) -> list[dict[str, Any]]:
    """Per chart on the page: ``{"id", "width", "height", "nonblank", "series"}`` (pixels)."""
    return page.evaluate(CANVAS_JS)  # type: ignore[no-any-return]
