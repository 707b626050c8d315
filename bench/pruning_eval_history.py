"""History-pruning evaluation: tau-bench airline replayed through the real pipeline.

Each run is a session (memory merged like the proxy does); request *k* is sent at ``15 k``
seconds to a fresh provider cache model per run (``cache.provider_models``: OpenAI, Anthropic,
radix). Three ways of meeting a history budget below the longest prompt are compared:

- ``watermark``: ``prune_history`` as shipped (compact at the high watermark down to the low one,
  then reuse the same compacted prefix);
- ``sliding_window``: the same pass with no memory and ``low == high`` — trims to just under the
  budget on every request, the usual ``trim_messages`` behaviour;
- ``no_pruning``: the prompt as sent (over budget).

Every request sent is checked with :func:`rewriter.validate.violations` for its API.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from bench import pruning_data as data
from cache.provider_models import make_model
from config.schema import RewriteSettings
from rewriter import wire
from rewriter.ir import Api
from rewriter.pipeline import rewrite_request, session_updates
from rewriter.prune_history import _msg_json
from rewriter.tokens import count_tokens
from rewriter.types import Context
from rewriter.validate import violations

GAP_S = 15.0


def _history_tokens(body: dict[str, Any], api: Api) -> int:
    return sum(count_tokens(_msg_json(m)) for m in wire.parse(body, api).messages)


def _client_body(api: Api, run: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    from proxy.sim_trace import openai_body, to_anthropic

    if api == "openai":
        return openai_body("gpt-4o", run.tools, messages)
    return to_anthropic("claude-sonnet-4-5", run.tools, messages)


def _replay(runs: list[Any], api: Api, provider: str, mode: str, high: int, low: int
            ) -> dict[str, Any]:
    settings = RewriteSettings.model_validate({
        "prune_history": mode != "no_pruning",
        "history_high_watermark_tokens": high,
        "history_low_watermark_tokens": high if mode == "sliding_window" else low})
    cached = total = invalid = requests = over = compactions = 0
    for run in runs:
        model = make_model(provider, count_tokens)
        memory: dict[str, Any] = {}
        for k, req in enumerate(run.requests):
            body = _client_body(api, run, req.messages)
            ctx = Context(settings, model=str(body["model"]), provider=provider,
                          session=MappingProxyType(dict(memory)))
            res = rewrite_request(body, api, ctx)
            if mode == "watermark":
                memory.update(session_updates(res))
            requests += 1
            if violations(wire.parse(res.body, api)):
                invalid += 1
            if _history_tokens(res.body, api) > high:
                over += 1
            compactions += sum(1 for e in res.edits
                               if e.pass_name == "prune_history" and "compaction #" in e.detail)
            outcome = model.process(res.body, k * GAP_S)
            cached += outcome.cached_read_tokens
            total += outcome.input_tokens
    return {"requests": requests, "invalid_requests": invalid,
            "requests_over_budget": over, "compactions": compactions,
            "input_tokens": total, "cached_share": round(cached / max(1, total), 4)}


def tau_history(quick: bool) -> dict[str, Any]:
    """Watermark vs sliding window vs none, per API and provider model (module docstring)."""
    from proxy.sim_trace import load_tau

    runs = load_tau(data.DATA / "traces" / "tau_bench_airline_gpt4o.json",
                    data.DATA / "tools" / "tau_bench_airline.json", runs=8 if quick else None)
    longest = max(_history_tokens(_client_body("openai", r, r.requests[-1].messages), "openai")
                  for r in runs if r.requests)
    high = int(longest * 0.4)
    low = high // 2
    out: dict[str, Any] = {"runs": len(runs), "longest_history_tokens": longest,
                           "high_watermark_tokens": high, "low_watermark_tokens": low}
    combos: list[tuple[Api, str]] = [("openai", "openai"), ("openai", "radix"),
                                     ("anthropic", "anthropic")]
    modes = ("watermark", "sliding_window", "no_pruning")
    for api, provider in combos:
        out[f"{api}_api_{provider}_cache"] = {m: _replay(runs, api, provider, m, high, low)
                                             for m in modes}
    return out
