"""Issue 37, "Done when": an 8-turn agent loop with a clock on line 2 of its system prompt and 3
tools, at temperature 0, through the proxy to the real local engine (SmolLM2-135M). Plain
``prefixgate report`` (no flags) and the dashboard's first card then name the break's cause,
its masked line, its cost and its fix, and the break sits at the engine's own token offset: the
cached tokens the engine reported on each turn after the first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from tests.browser import Chromium, chromium_path
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app
from tests.tiny_model import real_model_dir

MODEL = "SmolLM2-135M-Instruct"
TURNS = 8
RULES = " ".join(f"Rule {i}: answer about flight bookings politely and check the booking "
                 f"reference before any change." for i in range(1, 31))
TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {"ref": {"type": "string"}},
                   "required": ["ref"]}}}
    for name, desc in (("get_booking", "Look up a booking by its reference."),
                       ("change_seat", "Move a passenger to another seat."),
                       ("cancel_booking", "Cancel a booking and refund it."))]
QUESTIONS = ["Can you find booking AB12?", "What seat is it?", "Move me to a window seat.",
             "Is there a fee?", "What about baggage?", "Can I add a meal?", "When do I board?",
             "Thanks, that is all."]


def _system(turn: int) -> str:
    return (f"You are the airline's booking assistant.\nCurrent time: 2026-12-06 "
            f"09:{30 + turn:02d}:00 UTC\n{RULES}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Ledger]]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    # span reuse off: the engine as a backend that loses its prefix at the clock (with span reuse
    # on, the engine bridges this break and the report says so: test_span_reuse_engine_e2e.py)
    eng = Engine(EngineConfig(model_path=str(real_model_dir()), num_kv_slots=32768,
                              max_context_len=4096, model_name=MODEL, span_reuse=False))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "local", "base_url": engine_url + "/v1"}},
                "routes": [{"match": MODEL, "backend": "local"}],
                "ledger": {"path": str(tmp_path_factory.mktemp("l") / "ledger.sqlite")}})
            ledger = Ledger(policy.ledger.path)
            with serve_app(build_app(policy, ledger=ledger)) as url:
                yield url, ledger
    finally:
        eng.shutdown()


def _loop(url: str) -> list[int]:
    """The 8 turns; the engine's cached tokens of each."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy-anything", max_retries=0)
    history: list[dict[str, Any]] = []
    cached = []
    for turn, question in enumerate(QUESTIONS[:TURNS]):
        history.append({"role": "user", "content": question})
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": _system(turn)}, *history],
            tools=TOOLS, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)  # type: ignore[union-attr]
    return cached


@pytest.mark.slow
def test_the_report_and_the_dashboard_name_the_clock_its_cost_and_its_fix(
        stack: tuple[str, Ledger], tmp_path: Path) -> None:
    url, ledger = stack
    cached = _loop(url)
    rows = wait_rows(ledger, TURNS, timeout_s=60)
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows)
    breaks = sorted(ledger.breaks(), key=lambda b: b["request_seq"])
    # one break per turn after the first, at the clock, in the engine's own tokens: exactly
    # where the engine's cache stopped matching
    assert [b["request_seq"] for b in breaks] == list(range(1, TURNS))
    assert all(b["unit"] == "engine" and b["kind"] == "volatile_span" for b in breaks)
    assert [b["token_offset"] for b in breaks] == cached[1:], (breaks, cached)
    assert all(0 < c < 100 for c in cached[1:])  # the clock is near the top of the prompt

    res = CliRunner().invoke(cli, ["report", "--ledger", ledger.path], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    screen = " ".join(" ".join(res.output.splitlines()[:24]).split())
    offsets = sorted(set(cached[1:]))
    at = (f"token {offsets[0]}" if len(offsets) == 1
          else f"tokens {offsets[0]}-{offsets[-1]}")
    lost = sum(b["tokens_lost"] for b in breaks)
    for part in ("top cache break: a clock in the system prompt changes on every request "
                 f"({TURNS - 1} times, 1 session)",
                 '"Current time: \u27e8datetime\u27e9" · system prompt, line 2',
                 f"the prefix breaks at {at}: {MODEL}'s own tokens (its /tokenize), from the "
                 "start of the rendered prompt",
                 f"cost: {lost:,} prompt tokens prefilled again", "s of prefill",
                 "fix: rewrite: {hoist_volatile: true}"):
        assert part in screen, (part, res.output)

    doc = httpx.get(url + "/api/savings?range=1h", timeout=60).json()
    top = doc["top_break"]
    report_json = json.loads(CliRunner().invoke(cli, ["report", "--ledger", ledger.path,
                                                      "--json"]).output)
    assert top == report_json["top_break"]  # one source
    assert (top["token_offset"], top["token_offset_max"]) == (offsets[0], offsets[-1])
    print(res.output)  # the new first screen (pytest -s shows it)
    if chromium_path() is None:
        return
    with Chromium.launch() as browser:
        page = browser.page
        page.navigate(url + "/dashboard")
        page.wait_for("document.body !== null && document.body.dataset.state === 'ready'")
        first = page.evaluate("document.querySelector('#totals .card').id")
        card = page.evaluate("document.getElementById('top-break').textContent")
    assert first == "top-break"
    for part in (top["cause"], "Current time: \u27e8datetime\u27e9", "system prompt, line 2",
                 f"{lost:,} prompt tokens prefilled again", "rewrite: {hoist_volatile: true}"):
        assert part in card, (part, card)
