"""End to end: real traffic through the proxy (scripted upstream, real pipeline, ledger on
disk), then /dashboard in headless Chromium against the proxy's own ``/api/savings``.

The numbers on the page equal ``/api/savings``, which equals the ledger (request count, prompt
and cached tokens); every chart is drawn or shows an honest empty state; no console errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.browser import Page
from tests.dashboard.page_check import canvas_report, expected_keys, number_mismatches, shown_numbers
from tests.dashboard.savings_fixture import contract_errors
from tests.proxy.upstream import DONE, Script, ScriptedUpstream, chunk, completion, wait_rows
from tests.servers import serve_app

READY = ("document.readyState === 'complete' && ['ready', 'failed'].includes(document.body.dataset.state)"
         " && document.body.dataset.state")
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Does thing {i}.",
                                           "parameters": {"type": "object", "properties": {}}}}
         for i in range(3)]


def usage(prompt: int, cached: int, out: int = 5) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": cached}}


def script_for(i: int) -> Any:
    """Request i: streamed when odd; usage grows with i, the cached part with it."""
    u = usage(200 + 40 * i, 32 * i)
    if i % 2:
        return Script(pieces=[chunk("he"), chunk("llo", finish="stop"), chunk(usage=u), DONE],
                      delay_s=0.01)
    return Script(body=completion("hello", usage=u))


def send_traffic(url: str, up: ScriptedUpstream, n: int) -> None:
    """``n`` chat requests through the proxy at ``url`` (three sessions, odd ones streamed)."""
    with httpx.Client(base_url=url) as client:
        for i in range(n):
            up.script = script_for(i)
            body = {"model": "m", "stream": bool(i % 2), "tools": TOOLS, "messages": [
                {"role": "system", "content": "You are an airline agent."},
                {"role": "user", "content": f"Question {i}: change my flight."}]}
            if i % 2:
                body["stream_options"] = {"include_usage": True}
            r = client.post("/v1/chat/completions", json=body,
                            headers={"x-prefixgate-session": f"s{i % 3}"})
            assert r.status_code == 200, r.text


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[str, Ledger, ScriptedUpstream]]:
    """A proxy (real pipeline, ledger on disk) in front of a scripted upstream."""
    up = ScriptedUpstream()
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
                               "routes": [{"match": "*", "backend": "up"}],
                               "ledger": {"path": str(tmp_path / "ledger.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger)) as url:
            yield url, ledger, up


def test_page_numbers_equal_api_savings_equal_the_ledger(rig: tuple[str, Ledger, ScriptedUpstream],
                                                          page: Page) -> None:
    url, ledger, up = rig
    send_traffic(url, up, 12)
    wait_rows(ledger, 12)
    api = httpx.get(url + "/api/savings?range=1h").json()
    assert contract_errors(api) == []
    rows = ledger.rows()
    t = api["totals"]
    assert t["requests"] == len(rows) == 12
    assert t["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows) == sum(200 + 40 * i for i in range(12))
    assert t["cached_tokens"] == sum(r["cached_tokens"] for r in rows) == sum(32 * i for i in range(12))

    page.navigate(url + "/dashboard")
    assert page.wait_for(READY) == "ready", page.evaluate("window.dash.error")
    seen = page.evaluate("window.dash.payload")
    shown = shown_numbers(page)
    charts = {c["id"]: c for c in canvas_report(page)}
    texts = page.evaluate("Object.fromEntries([...document.querySelectorAll('.panel')]"
                          ".map(p => [p.id, p.querySelector('.body').textContent]))")
    assert page.errors == []
    assert seen["totals"] == t  # what the page drew is what the API says now
    assert number_mismatches(seen, shown) == []
    assert not expected_keys(seen) - {k for k, _, _ in shown}
    for must in ("p-cached", "p-tokens", "p-ttft", "p-len-prompt"):
        assert must in charts and charts[must]["series"] > 15, (must, charts.get(must))
    for panel in ("p-saved", "p-tpot", "p-len-output"):  # drawn, or said why not
        assert (panel in charts and charts[panel]["series"] > 15) or "not reported" in texts[panel] \
            or "no requests" in texts[panel], (panel, texts[panel])


def test_a_fresh_proxy_shows_no_requests_without_errors(rig: tuple[str, Ledger, ScriptedUpstream],
                                                        page: Page) -> None:
    url, _, _ = rig
    api = httpx.get(url + "/api/savings?range=24h").json()
    assert contract_errors(api) == [] and api["totals"]["requests"] == 0
    page.navigate(url + "/dashboard#24h")
    assert page.wait_for(READY) == "ready", page.evaluate("window.dash.error")
    shown = shown_numbers(page)
    texts = page.evaluate("Object.fromEntries([...document.querySelectorAll('.panel')]"
                          ".map(p => [p.id, p.querySelector('.body').textContent]))")
    assert page.errors == [] and canvas_report(page) == []
    assert number_mismatches(page.evaluate("window.dash.payload"), shown) == []
    for panel in ("p-cached", "p-tokens", "p-ttft", "p-len-prompt"):
        assert texts[panel] == "no requests in this range", (panel, texts[panel])
