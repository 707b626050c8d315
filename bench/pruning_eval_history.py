"""History-pruning evaluation: tau-bench airline replayed through the real pipeline.

Each run is a session (memory merged like the proxy does); request *k* is sent at ``15 k``
seconds to a fresh provider cache model per run (``cache.provider_models``: OpenAI, Anthropic,
radix). Three ways of meeting a history budget below the longest prompt are compared:

- ``watermark``: ``prune_history`` as shipped (compact at the high watermark down to the low one,
  then reuse the same compacted prefix);
- ``sliding_window``: the same pass with no memory and ``low == high`` — trims to just under the
  budget on every request, the usual ``trim_messages`` behaviour;
- ``no_pruning``: the prompt as sent (over budget).

Validity is measured where it can fail. ``run_passes`` reverts a pass whose output breaks an API
rule and ``prune_history`` returns its input when its own compaction is invalid, so the request
that is finally sent is valid by construction. Each request therefore also records, through a
probe wrapped around ``prune_history`` inside the real pipeline (same input, same context):

- ``raw_compactions_invalid``: the pass's RAW output — the remembered or new plan applied
  (:func:`raw_compaction`), before its self-check — checked with
  :func:`prefixgate.rewriter.wire.validate.violations` (independent of the pass) for violations its input did
  not have; ``raw_violations`` counts them by kind;
- ``self_check_reverts``: ``prune_history`` Edits saying "would be invalid, input kept";
- ``pipeline_reverts``: Edits of any pass the pipeline reverted or that failed ("output
  invalid" / "pass failed", fail-open), by pass name.

Each of these is a defect (the budget was silently not met); the goal is 0. The request sent
is still checked too (``invalid_requests``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from bench import pruning_data as data
from prefixgate.cache.provider_models import make_model
from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.analysis.stable import stable_prefix_hash
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.passes import prune_history
from prefixgate.rewriter.passes.prune_history import _msg_json
from prefixgate.rewriter.pipeline import PASSES, run_passes, session_updates
from prefixgate.rewriter.types import Context, Edit, RewriteResult
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api, Prompt
from prefixgate.rewriter.wire.validate import violations

GAP_S = 15.0


def _history_tokens(body: dict[str, Any], api: Api) -> int:
    return sum(count_tokens(_msg_json(m)) for m in wire.parse(body, api).messages)


def raw_compaction(prompt: Prompt, ctx: Context) -> Prompt | None:
    """What ``prune_history.run`` would return for ``prompt`` BEFORE its own validity check:
    the remembered plan, extended by a compaction when the history is over the high watermark,
    applied to the messages. None when the pass leaves the prompt alone (empty plan). Built
    from the pass's public pieces (``stored_plan``, ``will_compact``, ``compact``,
    ``apply_plan``), the same way tests/rewriter/test_passes_without_safety_net.py reaches it."""
    msgs = prompt.messages
    plan = prune_history.stored_plan(msgs, ctx)
    if prune_history.will_compact(prompt, ctx):
        plan = prune_history.compact(msgs, plan, ctx)
    if plan.empty:
        return None
    return replace(prompt, messages=tuple(prune_history.apply_plan(msgs, plan, ctx)))


@dataclass
class Probe:
    """Counts, over many requests, how often ``prune_history``'s raw output was invalid."""

    raw_checked: int = 0
    raw_invalid: int = 0
    raw_violations: Counter[str] = field(default_factory=Counter)

    def __call__(self, prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
        """A ``PassFn``: record the raw compaction's violations, then run the real pass."""
        raw = raw_compaction(prompt, ctx)
        if raw is not None:
            self.raw_checked += 1
            bad = violations(raw) - violations(prompt)  # new ones; a kind, never a key (ids)
            if bad:
                self.raw_invalid += 1
                self.raw_violations.update(kind for kind, _ in bad.elements())
        return prune_history.run(prompt, ctx)


def probed_rewrite(body: dict[str, Any], api: Api, ctx: Context, probe: Probe) -> RewriteResult:
    """``rewrite_request`` with ``probe`` standing in for ``prune_history`` (which it calls):
    the same passes, order, safety net and rendering; the body is returned as-is when no pass
    applied."""
    passes = tuple(replace(s, fn=probe) if s.name == prune_history.NAME else s for s in PASSES)
    prompt = wire.parse(body, api)
    out, edits = run_passes(prompt, ctx, passes)
    final = wire.render(out) if any(e.applied for e in edits) else body
    return RewriteResult(final, edits, stable_prefix_hash(out))


def reverts(edits: list[Edit]) -> tuple[int, Counter[str]]:
    """``(prune_history self-check reverts, pipeline reverts/failures by pass name)``."""
    own = sum(1 for e in edits if e.pass_name == prune_history.NAME and not e.applied
              and "would be invalid" in e.detail)
    net = Counter(e.pass_name for e in edits
                  if not e.applied and e.detail.startswith(("pass failed", "output invalid")))
    return own, net


def _client_body(api: Api, run: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    from prefixgate.proxy.sim.traces import openai_body, to_anthropic

    if api == "openai":
        return openai_body("gpt-4o", run.tools, messages)
    return to_anthropic("claude-sonnet-4-5", run.tools, messages)


def _replay(runs: list[Any], api: Api, provider: str, mode: str, high: int, low: int
            ) -> dict[str, Any]:
    settings = RewriteSettings.model_validate({
        "prune_history": mode != "no_pruning",
        "history_high_watermark_tokens": high,
        "history_low_watermark_tokens": high if mode == "sliding_window" else low})
    cached = total = invalid = requests = over = compactions = self_reverts = 0
    net_reverts: Counter[str] = Counter()
    probe = Probe()
    for run in runs:
        model = make_model(provider, count_tokens)
        memory: dict[str, Any] = {}
        for k, req in enumerate(run.requests):
            body = _client_body(api, run, req.messages)
            ctx = Context(settings, model=str(body["model"]), provider=provider,
                          session=MappingProxyType(dict(memory)))
            res = probed_rewrite(body, api, ctx, probe)
            own, net = reverts(res.edits)
            self_reverts += own
            net_reverts.update(net)
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
            "raw_compactions_checked": probe.raw_checked,
            "raw_compactions_invalid": probe.raw_invalid,
            "raw_violations": dict(sorted(probe.raw_violations.items())),
            "self_check_reverts": self_reverts,
            "pipeline_reverts": dict(sorted(net_reverts.items())),
            "requests_over_budget": over, "compactions": compactions,
            "input_tokens": total, "cached_share": round(cached / max(1, total), 4)}


def tau_history(quick: bool) -> dict[str, Any]:
    """Watermark vs sliding window vs none, per API and provider model (module docstring)."""
    from prefixgate.proxy.sim.traces import load_tau

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
