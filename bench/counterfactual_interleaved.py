"""The counterfactual across interleaved conversations, against measurement (issue 19, item 3).

    .venv/bin/python bench/counterfactual_check.py --scripted [--conversations 4] [--turns 8]
        [--out bench/results/counterfactual_check_interleaved.json]

The first ``--conversations`` tau-bench airline runs (``../shared/data/traces``: one system
prompt and 14 tools shared by all) are replayed turn by turn, interleaved the way an agent
fleet's requests are, through the proxy (in process, the real rewrite pipeline) twice: to
one scripted engine with rewriting off (it MEASURES what the client's bodies cache) and to
another with rewriting on (the ledger MODELS it). The engines (:mod:`bench.prefix_engine`)
render the chat template, tokenize with o200k_base and keep one real prefix cache shared by all
conversations — what a provider's or an engine's cache is — with two rule sets:

* ``radix`` (our engine, vLLM, SGLang; ``openai_compat`` backend with ``/tokenize``): the
  counterfactual runs on the engine's own token ids, through one shared tree per deployment;
* ``openai`` (OpenAI's published rules; ``openai`` backend, no tokenizer): the block model (at
  most 15 requests per arm, so that OpenAI's per-prefix overflow to a second machine, which the
  model imitates and the scripted engine does not, stays out).

and two clocks: the system prompt's clock line as the trace recorded it (constant: every
conversation shares the system prompt and tools unrewritten — the cross-session case; the
``figures`` are this one's, radix rules) and advanced 7 s per request as ``prefixgate replay
--volatile-clock`` does (``detail.volatile_clock``; the line is near the top, so unrewritten
bodies share little). ``detail.openai_rules`` / ``openai_rules_volatile_clock``: the same under
OpenAI's rules, tool definitions rendered as compact JSON (OpenAI's own rendering is not
published; :mod:`bench.prefix_engine`); ``openai_rules_tools_with_spaces``: rendered as
``tojson`` does, which the block model under-counts (the 14 tools: 2,394 tokens with spaces,
1,991 compact) — the block model's error on an unknown template, not a sharing error.

``detail.per_session_model_cached_share`` (radix rules) is what the previous rule for tokenizing
engines (one tree per session) would have modelled for the same requests: cross-session hits
counted as savings (the block models were per backend already; null there). ``saved_tokens`` /
``by_technique_sum`` are the ledger's (``/api/savings``): the parts, named remainder included,
add up. Writes ``{"command", "figures": {"measured_unrewritten_cached_share",
"modelled_cached_share"}, "detail": {...}}`` (the shape of ``counterfactual_check.json``); shares
0-1, tokens tokens. Runs in seconds on a CPU (no model).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from bench.prefix_engine import PrefixEngine
from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.provider_models.token_radix import TokenCaches
from prefixgate.cache.savings.summary import savings_document
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.sim.traces import load_trace, openai_body
from prefixgate.proxy.sim.wall_clock import with_wall_clock
from prefixgate.rewriter.pipeline import rewrite_request

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
T0 = 1_715_785_200.0  # 2024-05-15 15:00:00 UTC, the trace's own clock
OPENAI_MAX_PER_ARM = 15


def replay(conversations: int, turns: int, rules: str, volatile_clock: bool,
           compact_tools: bool = False) -> dict[str, Any]:
    """Both arms of one interleaved replay under ``rules``, the system prompt's clock as
    recorded (one constant line) or advancing per request, tools rendered as ``tojson`` does or
    compact (:class:`bench.prefix_engine.PrefixEngine`); the figures and detail."""
    runs = load_trace(TRACE)[:conversations]
    engines = {arm: PrefixEngine(rules, compact_tools=compact_tools) for arm in ("on", "off")}
    kind = "openai_compat" if rules == "radix" else "openai"
    tmp = Path(tempfile.mkdtemp(prefix="pg-cf-interleaved-"))
    policy = parse_policy({
        "backends": {arm: {"kind": kind, "base_url": f"http://{arm}.test/v1"} for arm in engines},
        "routes": [{"match": f"gpt-4o-{arm}", "backend": arm} for arm in engines],
        "ledger": {"path": str(tmp / "ledger.sqlite"), "batch_writes": False},
        "default_max_tokens": 0})
    ledger = Ledger(policy.ledger.path)
    transport = httpx.MockTransport(lambda req: engines[req.url.host.split(".")[0]].handle(req))
    app = build_app(policy, ledger=ledger, rewrite_fn=rewrite_request, transport=transport)
    sent: list[tuple[str, dict[str, Any]]] = []   # (session, original body) of the "on" arm
    with TestClient(app) as client:
        for arm in ("off", "on"):
            clock = T0
            for t in range(turns):
                for run in runs:
                    if t >= len(run.requests):
                        continue
                    body = openai_body(f"gpt-4o-{arm}", run.tools, run.requests[t].messages)
                    if volatile_clock:
                        body = with_wall_clock(body, clock)
                    clock += 7.0
                    headers = {"x-prefixgate-session": f"{arm}-{run.run_id}"}
                    if arm == "off":
                        headers["x-prefixgate-rewrite"] = "off"
                    r = client.post("/v1/chat/completions", headers=headers,
                                    json={**body, "max_tokens": 1})
                    r.raise_for_status()
                    if arm == "on":
                        sent.append((run.run_id, body))
        doc = savings_document(ledger, "24h")
    rows = ledger.rows()
    off = [r for r in rows if r["model"] == "gpt-4o-off"]
    on = [r for r in rows if r["model"] == "gpt-4o-on"]
    measured = sum(r["cached_tokens"] for r in off) / sum(r["prompt_tokens"] for r in off)
    modelled = sum(r["cf_cached_tokens"] for r in on) / sum(r["prompt_tokens"] for r in on)
    old: float | None = None
    if rules == "radix":  # the previous rule for tokenizing engines: one tree per session
        per_session = TokenCaches()
        old = sum(per_session.process(f"on\x00{s}", engines["on"].ids(b)).cached_read_tokens
                  for s, b in sent) / sum(r["prompt_tokens"] for r in on)
    sources: dict[str, int] = {}
    for r in on:
        sources[r["cf_source"]] = sources.get(r["cf_source"], 0) + 1
    return {
        "figures": {"measured_unrewritten_cached_share": measured,
                    "modelled_cached_share": modelled},
        "detail": {
            "difference": abs(measured - modelled), "rules": rules, "backend_kind": kind,
            "clock": "advancing 7 s a request" if volatile_clock else "as recorded (constant)",
            "conversations": len(runs), "turns": turns, "requests_per_arm": len(on),
            "on_cf_source_counts": sources,
            "on_measured_cached_share": sum(r["cached_tokens"] for r in on)
            / sum(r["prompt_tokens"] for r in on),
            "per_session_model_cached_share": old,
            "saved_tokens": doc["totals"]["saved_tokens"],
            "added_tokens": doc["totals"]["added_tokens"],
            "by_technique": {t["technique"]: t["saved_tokens"] for t in doc["by_technique"]},
            "by_technique_sum": sum(t["saved_tokens"] for t in doc["by_technique"]),
        },
    }


def run(conversations: int, turns: int) -> dict[str, Any]:
    """The document (module docstring); ``command`` is set by the caller."""
    doc = replay(conversations, turns, "radix", volatile_clock=False)
    vol = replay(conversations, turns, "radix", volatile_clock=True)
    doc["detail"]["volatile_clock"] = {**vol["figures"], **vol["detail"]}
    openai_turns = max(1, min(turns, OPENAI_MAX_PER_ARM // max(1, conversations)))
    for key, clock, compact in (("openai_rules", False, True),
                                ("openai_rules_volatile_clock", True, True),
                                ("openai_rules_tools_with_spaces", False, False)):
        oa = replay(conversations, openai_turns, "openai", clock, compact)
        doc["detail"][key] = {**oa["figures"], **oa["detail"], "compact_tools": compact}
    doc["detail"]["trace"] = str(TRACE.relative_to(REPO.parent))
    return doc


if __name__ == "__main__":
    sys.exit("run it as: python bench/counterfactual_check.py --scripted")
