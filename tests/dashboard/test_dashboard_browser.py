"""The dashboard in headless Chromium against fixture ``/api/savings`` payloads: every chart's
canvas drawn, no console errors, the numbers on the page equal to the JSON, a screenshot, the
range selector, honest empty states, and the HTTP Basic login a browser does."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

from tests.browser import Page
from tests.dashboard.page_check import (
    canvas_report,
    expected_keys,
    number_mismatches,
    shown_numbers,
)
from tests.dashboard.savings_fixture import (
    KEY,
    busy_payload,
    fixture_app,
    idle_payload,
    keyed_guard,
    quiet_payload,
    selfhosted_payload,
    slow_payload,
)
from tests.servers import serve_app

READY = ("document.readyState === 'complete' && ['ready', 'failed'].includes(document.body.dataset.state)"
         " && document.body.dataset.state")
CHARTS = {"p-saved", "p-cached", "p-tokens", "p-ttft", "p-tpot", "p-len-prompt", "p-len-output"}
PAYLOADS = {r: busy_payload(r) for r in ("1h", "24h", "7d")}


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def load(page: Page, url: str) -> str:
    page.navigate(url)
    return str(page.wait_for(READY))


def test_busy_range_draws_every_chart_and_shows_the_json_numbers(page: Page, tmp_path: Path) -> None:
    with serve_app(fixture_app(PAYLOADS)) as url:
        assert load(page, url + "/dashboard") == "ready", page.evaluate("window.dash.error")
        shown = shown_numbers(page)
        png = page.screenshot()
    assert page.errors == []
    payload = PAYLOADS["1h"]
    assert number_mismatches(payload, shown) == []
    missing = expected_keys(payload) - {k for k, _, _ in shown}
    assert not missing, f"not shown: {sorted(missing)}"
    # "not reported" where the payload says null, e.g. the OpenAI route's queue time
    assert ("routes.0.queue_ms_p50", "ms", "not reported") in shown
    charts = {c["id"]: c for c in canvas_report(page)}
    assert set(charts) == CHARTS
    for c in charts.values():
        assert c["width"] > 200 and c["height"] > 150, c
        assert c["series"] > 100, f"{c['id']}: no data series drawn ({c})"
    width, height = png_size(png)
    assert width == 1400 and height > 1000
    (tmp_path / "dashboard.png").write_bytes(png)


def test_a_self_hosted_range_leads_with_the_prefill_time_saved(page: Page) -> None:
    local = selfhosted_payload()
    with serve_app(fixture_app({"1h": local})) as url:
        assert load(page, url + "/dashboard") == "ready"
        shown = shown_numbers(page)
        labels = page.evaluate("[...document.querySelectorAll('#totals .card:not(#top-break) .label')].map(e => e.textContent)")
        notes = page.evaluate("document.getElementById('totals').textContent")
    assert page.errors == [] and number_mismatches(local, shown) == []
    assert not expected_keys(local) - {k for k, _, _ in shown}
    assert labels[:2] == ["prefill time saved", "saved"]
    assert ("totals.prefill_s_saved", "s", "12.3 s") in shown
    assert ("totals.prefill_s_cached", "s", "48.2 s") in shown
    assert ("routes.1.prefill_ms_per_token", "rate", "0.053 ms/token") in shown
    assert "set price_per_mtok or usd_per_hour" in notes
    # priced ranges keep the money first, the time right after it
    with serve_app(fixture_app(PAYLOADS)) as url:
        load(page, url + "/dashboard")
        labels = page.evaluate("[...document.querySelectorAll('#totals .card:not(#top-break) .label')].map(e => e.textContent)")
    assert labels[:2] == ["saved", "prefill time saved"]


# Every fillText on a canvas, recorded with where the text actually lands in canvas pixels
# (its measured width placed by textAlign, through the context's transform) and the panel the
# canvas is in. uPlot draws its axes on the canvas, so this is what a person sees.
RECORD_TEXT_JS = """(() => {
  const P = CanvasRenderingContext2D.prototype, fill = P.fillText;
  window.__drawn = [];
  P.fillText = function (text, x, y, ...rest) {
    const w = this.measureText(text).width, a = this.textAlign;
    const x0 = a === "right" || a === "end" ? x - w : a === "center" ? x - w / 2 : x;
    const m = this.getTransform(), l = m.transformPoint({x: x0, y}), r = m.transformPoint({x: x0 + w, y});
    const panel = this.canvas.closest(".panel");
    window.__drawn.push({panel: panel ? panel.id : "", text: String(text), left: Math.min(l.x, r.x),
                         right: Math.max(l.x, r.x), width: this.canvas.width, align: a});
    return fill.call(this, text, x, y, ...rest);
  };
})()"""


def drawn_texts(page: Page, url: str) -> list[dict]:  # type: ignore[type-arg]
    """Every text the dashboard at ``url`` draws on its chart canvases (see RECORD_TEXT_JS)."""
    script = page.send("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_TEXT_JS})
    try:
        assert load(page, url) == "ready", page.evaluate("window.dash.error")
        return page.evaluate("window.__drawn")  # type: ignore[no-any-return]
    finally:
        page.send("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def test_axis_labels_are_drawn_whole_even_for_a_ttft_over_10_seconds(page: Page) -> None:
    """Issue 22, item 7: with a fixed 70 px y axis, "10,000 ms" lost its first digit at the
    canvas edge. Every label of every chart must lie inside its canvas, and the TTFT axis must
    say how high it goes: in seconds once its top tick reaches 10,000 ms, one unit per axis."""
    drawn = {}
    for name, payload in (("slow", slow_payload()), ("busy", PAYLOADS["1h"])):
        with serve_app(fixture_app({"1h": payload})) as url:
            drawn[name] = drawn_texts(page, url + "/dashboard")
        assert page.errors == []
        assert {d["panel"] for d in drawn[name]} == CHARTS
        cut = [d for d in drawn[name] if d["left"] < -0.5 or d["right"] > d["width"] + 0.5]
        assert cut == [], f"{name}: labels cut at the canvas edge: {cut}"

    def y_labels(name: str, panel: str) -> list[str]:  # the y axis: drawn right-aligned
        return [d["text"] for d in drawn[name] if d["panel"] == panel and d["align"] == "right"]

    slow_ttft = y_labels("slow", "p-ttft")
    assert slow_ttft and all(t.endswith(" s") for t in slow_ttft), slow_ttft
    assert "10 s" in slow_ttft and max(float(t.removesuffix(" s")) for t in slow_ttft) >= 20
    assert all(t.endswith(" ms") for t in y_labels("busy", "p-ttft"))  # short TTFTs stay in ms
    assert "$3,000.00" in y_labels("slow", "p-saved")  # the widest dollar label, whole
    # the tick format itself: the decimals the ticks need, the same on every tick of the axis
    assert page.evaluate("window.dash.msTicks([0, 2500, 5000, 7500, 10000])") == [
        "0.0 s", "2.5 s", "5.0 s", "7.5 s", "10.0 s"]
    assert page.evaluate("window.dash.msTicks([0, 4000, 8000])") == ["0 ms", "4,000 ms", "8,000 ms"]
    assert page.evaluate("window.dash.msTicks([0, 50000, 100000])") == ["0 s", "50 s", "100 s"]


def test_chart_data_is_the_payload_series(page: Page) -> None:
    with serve_app(fixture_app(PAYLOADS)) as url:
        load(page, url + "/dashboard")
        data = page.evaluate("Object.fromEntries(Object.entries(window.dash.charts)"
                             ".map(([id, u]) => [id, u.data]))")
    s = PAYLOADS["1h"]["series"]
    assert data["p-cached"][0] == s["ts"]
    assert data["p-cached"][1] == [v * 100 for v in s["cached_share"]]
    assert data["p-ttft"][1:4] == [s["ttft_ms"]["p50"], s["ttft_ms"]["p95"], s["ttft_ms"]["p99"]]
    assert data["p-tpot"][1] == s["tpot_ms"]["p50"]  # nulls stay gaps, not zeros
    assert data["p-ttft"][4] == [300] * len(s["ts"]) and data["p-ttft"][5] == [800] * len(s["ts"])
    t = s["tokens"]
    stacked_top = [a + b + c + d for a, b, c, d in zip(t["cache_read"], t["cache_write"],
                                                       t["uncached"], t["pruned"], strict=True)]
    assert data["p-tokens"][1] == stacked_top and data["p-tokens"][4] == t["cache_read"]
    assert data["p-len-prompt"][1] == PAYLOADS["1h"]["lengths"]["prompt"]["counts"]


def test_range_selector_fetches_and_redraws(page: Page) -> None:
    app = fixture_app(PAYLOADS)
    with serve_app(app) as url:
        load(page, url + "/dashboard")
        for rng in ("24h", "7d", "1h"):
            page.evaluate(f"document.querySelector('#ranges [data-range=\"{rng}\"]').click()")
            page.wait_for(f"window.dash.payload.range === '{rng}' && document.body.dataset.state === 'ready'")
            assert number_mismatches(PAYLOADS[rng], shown_numbers(page)) == []
            assert page.evaluate("document.querySelector('#ranges button.on').dataset.range") == rng
        assert page.evaluate("location.hash") == "#1h"
        page.navigate(url + "/dashboard#7d")  # a link to a range (same document: hashchange)
        page.wait_for("window.dash.payload.range === '7d' && document.body.dataset.state === 'ready'")
        page.send("Page.reload")  # the range survives a reload
        page.wait_for(READY)
        assert page.evaluate("window.dash.payload.range") == "7d"
    assert [r for r, _ in app.state.served] == ["1h", "24h", "7d", "1h", "7d", "7d"]
    assert page.errors == []


def test_nothing_reported_shows_empty_states_not_zeros(page: Page) -> None:
    quiet = quiet_payload()
    with serve_app(fixture_app({"1h": quiet})) as url:
        assert load(page, url + "/dashboard") == "ready"
        shown = shown_numbers(page)
        texts = page.evaluate("Object.fromEntries([...document.querySelectorAll('.panel')]"
                              ".map(p => [p.id, p.querySelector('.body').textContent]))")
        charts = canvas_report(page)
    assert page.errors == []
    assert number_mismatches(quiet, shown) == []
    assert ("totals.saved_usd", "usd", "not reported") in shown
    assert ("totals.ttft_p50_ms", "ms", "not reported") in shown
    assert not any(text in ("$0.0000", "0.0 ms") for _, _, text in shown)
    for panel in ("p-saved", "p-cached", "p-tokens", "p-ttft", "p-tpot", "p-len-prompt", "p-len-output"):
        assert "not reported" in texts[panel], (panel, texts[panel])
    assert "holdout off" in texts["p-holdout"] and "no cache breaks" in texts["p-breaks"]
    assert "no rewriting pass" in texts["p-technique"] and "no SLO set" in texts["p-slo"]
    assert charts == []


def test_a_range_without_requests_says_so(page: Page) -> None:
    idle = idle_payload()
    with serve_app(fixture_app({"1h": idle})) as url:
        assert load(page, url + "/dashboard") == "ready"
        shown = shown_numbers(page)
        texts = page.evaluate("Object.fromEntries([...document.querySelectorAll('.panel')]"
                              ".map(p => [p.id, p.querySelector('.body').textContent]))")
        charts = canvas_report(page)
    assert page.errors == [] and charts == []
    assert number_mismatches(idle, shown) == []
    assert ("totals.requests", "int", "0") in shown
    for panel in ("p-saved", "p-cached", "p-tokens", "p-ttft", "p-tpot", "p-len-prompt",
                  "p-len-output", "p-routes"):
        assert texts[panel] == "no requests in this range", (panel, texts[panel])


def test_a_failed_fetch_is_said_on_the_page(page: Page) -> None:
    with serve_app(fixture_app({})) as url:  # every range answers 400
        assert load(page, url + "/dashboard") == "failed"
        status = page.evaluate("document.getElementById('status').textContent")
    assert "could not load /api/savings: HTTP 400" in status and "unknown range" in status
    # the browser logs the failed fetch itself; nothing else went wrong
    assert all("status of 400" in e for e in page.errors), page.errors


def test_browser_login_with_basic_auth_carries_the_key_to_the_api(page: Page) -> None:
    """As a person does it: no header set by us; the 401's Basic challenge is answered with the
    key as password (what typing it into the browser's dialog does), and the browser resends it
    on the page's own fetch of /api/savings."""
    asked: list[str] = []

    def on_paused(params: dict) -> None:  # type: ignore[type-arg]
        page.post("Fetch.continueRequest", {"requestId": params["requestId"]})

    def on_auth(params: dict) -> None:  # type: ignore[type-arg]
        asked.append(params["request"]["url"])
        page.post("Fetch.continueWithAuth", {"requestId": params["requestId"], "authChallengeResponse": {
            "response": "ProvideCredentials", "username": "me", "password": KEY}})

    page.handlers["Fetch.requestPaused"] = on_paused
    page.handlers["Fetch.authRequired"] = on_auth
    app = fixture_app(PAYLOADS, keyed_guard())
    with serve_app(app) as url:
        page.send("Fetch.enable", {"handleAuthRequests": True, "patterns": [{"urlPattern": "*"}]})
        assert load(page, url + "/dashboard") == "ready"
        shown = shown_numbers(page)
    assert asked == [url + "/dashboard"]  # asked once, for the page
    want = "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()
    assert app.state.served == [("1h", want)]
    assert number_mismatches(PAYLOADS["1h"], shown) == []
    assert [e for e in page.errors if "401" not in e] == []
