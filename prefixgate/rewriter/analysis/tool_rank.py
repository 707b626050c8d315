"""Rank a tool catalog against a conversation, and choose how many tools to keep.

Ranking is BM25 (:mod:`prefixgate.rewriter.analysis.bm25`) of a query built from the conversation's
text against one document per tool: the tool's name (split on case, ``_`` and ``.``; weighted x2),
its description, and its parameters' names and descriptions (recursively through nested objects and
arrays).

Choosing is a *keep rule* (:class:`KeepRule`), not a fixed k: keep at least ``min_keep`` tools,
every tool whose score is at least ``score_ratio`` x the best score, at most ``max_keep``. On BFCL
``live_multiple`` (see ``bench/pruning_eval.py``) a query-only ranker puts the gold function in the
top 10 of ~2,000 functions about as often as in the top 10% of 50, so the rule keeps a floor of
tools rather than a share of the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixgate.rewriter.analysis.bm25 import bm25_scores, terms


@dataclass(frozen=True)
class ToolInfo:
    """What ranking needs from one tool definition, whatever its wire shape.

    ``name``: the tool's name; ``description``: free text ('' if none); ``parameters``: its JSON
    Schema (``{"type": "object", "properties": {...}}``), ``{}`` if none.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    @staticmethod
    def from_wire(tool: Mapping[str, Any]) -> ToolInfo:
        """Read an OpenAI (``{"type":"function","function":{...}}``), Anthropic
        (``{"name","description","input_schema"}``), MCP (``inputSchema``) or BFCL
        (``parameters``) tool. Server tools without a schema get ``parameters == {}``."""
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        assert isinstance(fn, Mapping)
        schema = fn.get("parameters") or fn.get("input_schema") or fn.get("inputSchema") or {}
        return ToolInfo(
            name=str(fn.get("name", "")),
            description=str(fn.get("description") or ""),
            parameters=schema if isinstance(schema, Mapping) else {},
        )


def _schema_text(schema: Any, out: list[str], depth: int = 0) -> None:
    if depth > 6 or not isinstance(schema, Mapping):
        return
    props = schema.get("properties")
    if isinstance(props, Mapping):
        for key, sub in props.items():
            out.append(str(key))
            if isinstance(sub, Mapping):
                desc = sub.get("description")
                if isinstance(desc, str):
                    out.append(desc)
                enum = sub.get("enum")
                if isinstance(enum, list):
                    out.extend(str(v) for v in enum[:20])
            _schema_text(sub, out, depth + 1)
    for key in ("items", "additionalProperties"):
        _schema_text(schema.get(key), out, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        alts = schema.get(key)
        if isinstance(alts, list):
            for alt in alts:
                _schema_text(alt, out, depth + 1)


def tool_terms(tool: ToolInfo, name_weight: int = 2) -> list[str]:
    """The BM25 document of one tool: name terms x ``name_weight``, description, parameter names,
    parameter descriptions and enum values."""
    parts: list[str] = []
    _schema_text(tool.parameters, parts)
    return terms(tool.name) * name_weight + terms(tool.description) + terms(" ".join(parts))


def query_terms(user_texts: Sequence[str], other_texts: Sequence[str] = ()) -> list[str]:
    """The BM25 query of a conversation: the newest user text x3, earlier user texts x1, other
    text (assistant prose) x1. ``user_texts`` are oldest first."""
    if not user_texts and not other_texts:
        return []
    q: list[str] = []
    if user_texts:
        q.extend(terms(user_texts[-1]) * 3)
        for t in user_texts[:-1]:
            q.extend(terms(t))
    for t in other_texts:
        q.extend(terms(t))
    return q


def param_names(schema: Mapping[str, Any]) -> frozenset[str]:
    """Top-level argument names of a tool's JSON schema."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return frozenset(str(k) for k in props) if isinstance(props, Mapping) else frozenset()


def siblings(tools: Sequence[ToolInfo], seeds: Sequence[str], max_df_share: float = 0.05
             ) -> list[str]:
    """Tools that share a *specific* argument name with a seed tool (e.g. ``reservation_id``
    links ``cancel_reservation`` to ``get_reservation_details``): tools of one workflow pass
    the same identifiers around. An argument is specific when at most ``max_df_share`` of the
    catalog (and at least 2 tools) take it, so ``id`` / ``query`` / ``owner`` in a large catalog
    of one vendor link nothing. Returns names in catalog order, seeds excluded."""
    params = {t.name: param_names(t.parameters) for t in tools}
    df: dict[str, int] = {}
    for ps in params.values():
        for p in ps:
            df[p] = df.get(p, 0) + 1
    limit = max(2, int(max_df_share * len(tools)))
    seed_set = set(seeds)
    keys = {p for s in seeds for p in params.get(s, ()) if 2 <= df[p] <= limit}
    return [t.name for t in tools if t.name not in seed_set and params[t.name] & keys]


def rank_tools(tools: Sequence[ToolInfo], query: Sequence[str]) -> list[tuple[str, float]]:
    """``[(name, score)]`` best first; ties broken by name so the order is deterministic."""
    scores = bm25_scores([tool_terms(t) for t in tools], query)
    ranked = [(t.name, s) for t, s in zip(tools, scores)]
    ranked.sort(key=lambda p: (-p[1], p[0]))
    return ranked


@dataclass(frozen=True)
class KeepRule:
    """How many ranked tools to keep.

    1. the ``min_keep`` best, plus every tool scoring at least ``score_ratio`` x the best score
       (score > 0), at most ``max_keep`` in this step (``0`` = no cap);
    2. then, in rank order, every further tool that still fits while the kept tools' tokens stay
       within ``token_share`` of the catalog's tokens (tools that do not fit are skipped, so
       small tools further down still get in). A miss costs a failed call while a kept tool
       costs only its tokens, so a small tool is kept more readily than a large one.
    """

    min_keep: int = 10
    score_ratio: float = 0.5
    max_keep: int = 24
    token_share: float = 0.25

    def select(self, ranked: Sequence[tuple[str, float]],
               tokens: Mapping[str, int] | None = None) -> list[str]:
        """Names to keep from ``ranked`` (output of :func:`rank_tools`), in rank order.
        ``tokens``: tokens per tool name (step 2 is skipped without it)."""
        if not ranked:
            return []
        best = ranked[0][1]
        keep: list[str] = []
        cap = max(self.max_keep, self.min_keep) if self.max_keep else len(ranked)
        for i, (name, score) in enumerate(ranked):
            if len(keep) >= cap:
                break
            if i < self.min_keep or (best > 0 and score > 0 and score >= self.score_ratio * best):
                keep.append(name)
            else:
                break
        if tokens is None or self.token_share <= 0:
            return keep
        allowance = self.token_share * sum(tokens.get(n, 0) for n, _ in ranked)
        used = sum(tokens.get(n, 0) for n in keep)
        chosen = set(keep)
        for name, _ in ranked:
            if name in chosen:
                continue
            cost = tokens.get(name, 0)
            if used + cost <= allowance:
                keep.append(name)
                chosen.add(name)
                used += cost
        return keep


SIBLING_SEEDS = 3


def select_tools(tools: Sequence[ToolInfo], ranked: Sequence[tuple[str, float]],
                 tokens: Mapping[str, int] | None, rule: KeepRule,
                 seeds: int = SIBLING_SEEDS) -> list[str]:
    """The production selection: ``rule.select(ranked, tokens)`` plus the :func:`siblings` of the
    ``seeds`` best-ranked tools with a positive score. Names in rank order, siblings last."""
    keep = rule.select(ranked, tokens)
    top = [n for n, s in ranked[:seeds] if s > 0]
    chosen = set(keep)
    return keep + [n for n in siblings(tools, top) if n not in chosen]
