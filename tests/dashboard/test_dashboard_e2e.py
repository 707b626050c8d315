"""End to end: real traffic through the proxy (scripted upstream, real pipeline, ledger on
disk), then /dashboard in headless Chromium against the proxy's own ``/api/savings``.

The numbers on the page equal ``/api/savings``, which equals the ledger (request count, prompt
and cached tokens); every chart is drawn or shows an honest empty state; no console errors.
Skipped only while the proxy has no ``/api/savings`` (the savings endpoint lands separately).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache.ledger import Ledger
from config.loader import parse_policy
from proxy.app import build_app
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


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    up = ScriptedUpstream()
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
                               "routes": [{"match": "*", "backend": "up"}],
                               "ledger": {"path": str(tmp_path / "ledger.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger)) as url:
            probe = httpx.get(url + "/api/savings?range=1h")
            if probe.status_code == 404:
                pytest.skip("the proxy has no GET /api/savings yet (issue 9's savings endpoint, "
                            "branch h/savings, is not merged); the page is tested on fixtures in "
                            "test_dashboard_browser.py")
            with httpx.Client(base_url=url) as client:
                for i in range(12):
                    up.script = script_for(i)
                    body = {"model": "m", "stream": bool(i % 2), "tools": TOOLS, "messages": [
                        {"role": "system", "content": "You are an airline agent."},
                        {"role": "user", "content": f"Question {i}: change my flight."}]}
                    if i % 2:
                        body["stream_options"] = {"include_usage": True}
                    r = client.post("/v1/chat/completions", json=body,
                                    headers={"x-prefixgate-session": f"s{i % 3}"})
                    assert r.status_code == 200, r.text
            wait_rows(ledger, 12)
            yield url, ledger


def test_page_numbers_equal_api_savings_equal_the_ledger(proxy: tuple[str, Ledger], page: Page) -> None:
    url, ledger = proxy
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
