"""The dashboard explains itself (issue 37): its first card is the top cache break (cause, masked
line, where, cost, fix; the same object as ``prefixgate report``'s), the wide tables fit a
1280 px window without a scrollbar, an unpriced range says so once, requests refused before
routing are a labelled route row."""

from __future__ import annotations

from typing import Any

from tests.browser import Page
from tests.dashboard.page_check import number_mismatches, shown_numbers
from tests.dashboard.savings_fixture import TOP_BREAK, busy_payload, fixture_app, selfhosted_payload
from tests.servers import serve_app

READY = ("document.readyState === 'complete' && ['ready', 'failed'].includes(document.body.dataset.state)"
         " && document.body.dataset.state")
OVERFLOW_JS = """[...document.querySelectorAll('.panel .scroll')].map(d => ({
  panel: d.closest('.panel').id, scroll: d.scrollWidth, client: d.clientWidth}))"""


def _load(page: Page, url: str, width: int = 1400) -> None:
    page.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 1000,
                                                      "deviceScaleFactor": 1, "mobile": False})
    page.navigate(url)
    assert page.wait_for(READY) == "ready", page.evaluate("window.dash.error")


def _widest() -> dict[str, Any]:
    """The busy range with every optional route column (prefill rate, P/D split) and a row of
    requests refused before routing."""
    p = busy_payload()
    p["routes"].append({**p["routes"][0], "route": "(no route matched)", "model": "gtp-4o-mini-typo",
                        "backend": "", "requests": 3, "errors": 3})
    return p


def test_the_first_card_is_the_top_break_with_cause_line_cost_and_fix(page: Page) -> None:
    p = busy_payload()
    try:
        with serve_app(fixture_app({"1h": p})) as url:
            _load(page, url + "/dashboard")
            first = page.evaluate("document.querySelector('#totals .card').id")
            text = page.evaluate("document.getElementById('top-break').textContent")
            shown = shown_numbers(page)
    finally:
        page.send("Emulation.clearDeviceMetricsOverride")
    assert page.errors == [] and number_mismatches(p, shown) == []
    assert first == "top-break"
    for part in (TOP_BREAK["cause"], TOP_BREAK["excerpt"], "system prompt, line 2",
                 "breaks at token 37–38", "18,211 prompt tokens prefilled again", "$0.0410",
                 "fix: rewrite: {hoist_volatile: true}"):
        assert part in text, (part, text)
    breaks = page.evaluate("document.getElementById('p-breaks').textContent")
    assert TOP_BREAK["cause"] in breaks and "send the same tools" in breaks


def test_wide_tables_fit_a_1280_px_window(page: Page) -> None:
    p = _widest()
    try:
        with serve_app(fixture_app({"1h": p})) as url:
            _load(page, url + "/dashboard", width=1280)
            sizes = page.evaluate(OVERFLOW_JS)
            routes = page.evaluate("document.getElementById('p-routes').textContent")
            shown = shown_numbers(page)
    finally:
        page.send("Emulation.clearDeviceMetricsOverride")
    assert page.errors == [] and number_mismatches(p, shown) == []
    clipped = [s for s in sizes if s["scroll"] > s["client"]]
    assert not clipped, clipped
    assert {s["panel"] for s in sizes} >= {"p-routes", "p-breaks"}
    assert "(no route matched)" in routes


def test_an_unpriced_range_says_so_once(page: Page) -> None:
    p = selfhosted_payload()
    try:
        with serve_app(fixture_app({"1h": p})) as url:
            _load(page, url + "/dashboard")
            totals = page.evaluate("document.getElementById('totals').textContent")
    finally:
        page.send("Emulation.clearDeviceMetricsOverride")
    assert "not reported of not reported" not in totals
    assert totals.count("no price: set price_per_mtok") == 1
