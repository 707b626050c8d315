"""A small scripted run for the README's "Savings report" section (issue 9).

``python -m bench.savings_demo LEDGER.sqlite [--sessions 40]`` sends agent sessions (a system
prompt with a clock that changes every request, three turns each) through the proxy, in
process, to a scripted OpenAI-compatible upstream that keeps a prefix cache over the sent
messages (1 token = 4 characters of their JSON; cached = longest prefix shared with an earlier
request) and reports ``X-Engine-TTFT-Ms`` = 5 ms + 0.05 ms per uncached token. Two routes
(``gpt-4o*``, ``gpt-4.1*``), a 25 % holdout. Then ``prefixgate report --ledger LEDGER.sqlite``
shows the result. The upstream is a model of a cache, not a real backend: the figures show
what the report prints, not what a real provider would save.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.rewriter.pipeline import rewrite_request

RULES = "Follow the airline policy. Be brief. Verify the user id first. " * 60


class PrefixCache:
    """The scripted upstream's cache: every sent message list, as JSON text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one chat completion with usage and a TTFT header from the cache."""
        body = json.loads(request.content)
        text = json.dumps(body["messages"])
        shared = 0
        for t in self.texts:
            n, i = min(len(t), len(text)), 0
            while i < n and t[i] == text[i]:
                i += 1
            shared = max(shared, i)
        self.texts.append(text)
        prompt, cached = len(text) // 4, shared // 4
        usage = {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        answer = {"id": "c", "object": "chat.completion", "created": 1, "model": body["model"],
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": "ok"}}],
                  "usage": usage}
        return httpx.Response(200, json=answer, headers={
            "x-engine-ttft-ms": f"{5 + 0.05 * (prompt - cached):.1f}",
            "x-engine-decode-ms": "110.0"})


def run(ledger_path: Path, sessions: int = 40) -> None:
    """Send ``sessions`` three-turn sessions through the proxy into ``ledger_path``."""
    policy = parse_policy({
        "backends": {"up": {"kind": "openai_compat", "base_url": "http://up.test/v1"}},
        "routes": [{"match": "gpt-4o*", "backend": "up"}, {"match": "gpt-4.1*", "backend": "up"}],
        "ledger": {"path": str(ledger_path)}, "holdout": {"fraction": 0.25, "seed": 1},
        "rewrite": {"hoist_volatile": True}})  # opt-in (MOVES_THE_MODEL_READS): the demo's clock moves
    ledger = Ledger(ledger_path)
    app = build_app(policy, ledger=ledger, rewrite_fn=rewrite_request,
                    transport=httpx.MockTransport(PrefixCache().handle))
    with TestClient(app) as client:
        for s in range(sessions):
            model = "gpt-4o" if s % 2 else "gpt-4.1-mini"
            msgs: list[dict[str, Any]] = [{"role": "user", "content": f"Trip {s}: change it"}]
            for turn in range(3):
                system = f"You are Helper. Now: 2026-12-01 10:{(3 * s + turn) % 60:02d}. {RULES}"
                r = client.post("/v1/chat/completions", headers={
                    "x-prefixgate-session": f"demo-{s}"},
                                json={"model": model,
                                      "messages": [{"role": "system", "content": system}, *msgs]})
                r.raise_for_status()
                msgs += [{"role": "assistant", "content": "ok"},
                         {"role": "user", "content": f"and step {turn + 2}"}]
    ledger.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args[args.index("--sessions") + 1]) if "--sessions" in args else 40
    run(Path(args[0]), n)
