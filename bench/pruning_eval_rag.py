"""RAG-pruning evaluation: required/gold passage recall vs passage tokens removed, per budget.

The budget decides how much must go, so a removed share alone says nothing about the pass. Every
point therefore reports what the budget forced (``over_budget_share``: passage tokens above it),
what the pass removed (``tokens_removed_share``), the difference, and recall next to a
ranking-blind packer's (``random_order_recall``: whole passages in a random order while they
fit). Tokens are passage tokens (``<document>`` tags included); ``prune_rag`` prunes only
retrieved content, only a retrieval over budget, and its dedupe drops only passages wholly
contained in another (``contained_duplicates_dropped``).

- NQ-open oracle: each question's gold passage among 19 distractors (other questions' gold
  passages), sent through the real ``prune_rag`` pass as ``<document id=...>`` chunks of a user
  message (injected retrieval), at the default policy budget and over budget shares 0.1-1.0.
- tau2 banking knowledge base (698 documents, 77 tasks with ``required_documents``): each task's
  instructions are the query, (a) against the whole knowledge base, (b) against the 50 documents
  a BM25 retriever returns for it (recall counted over the required documents inside those 50),
  curves with ``select_passages``; the top 50 also through the real pass at the default budget.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from bench import pruning_data as data
from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.analysis.bm25 import bm25_scores, terms
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.passes import prune_rag
from prefixgate.rewriter.passes.dedupe import near_duplicates
from prefixgate.rewriter.passes.prune_rag import select_passages
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire import codec as wire

KB_SHARES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
TOP50_SHARES = (0.2, 0.3, 0.5, 0.7)
NQ_SHARES = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
DEFAULT_BUDGET = RewriteSettings().rag_budget_tokens


@dataclass
class _Acc:
    """Sums over questions at one budget (tokens are passage tokens, tags included)."""

    budget: int | None = None
    share: float | None = None
    gold: int = 0
    hits: int = 0
    random_hits: int = 0
    total: int = 0
    kept: int = 0
    forced: int = 0
    over: int = 0
    applied: int = 0
    contained: int = 0

    def add(self, budget: int, total: int, kept: int, edit: Edit | None, gold: int, hits: int,
            random_hits: int) -> None:
        """One retrieval: ``total`` / ``kept`` passage tokens; ``edit``: the pass's Edit (None
        when measured with ``select_passages``: applied when anything was dropped)."""
        self.gold += gold
        self.hits += hits
        self.random_hits += random_hits
        self.total += total
        self.kept += kept
        self.forced += max(0, total - budget)
        self.over += int(total > budget)
        self.applied += int(edit.applied) if edit else int(kept < total)
        self.contained += _contained(edit.detail) if edit else 0

    def point(self) -> dict[str, Any]:
        """One curve point: what the budget forced vs what the pass removed and kept."""
        label = {"budget_tokens": self.budget} if self.budget else {"budget_share": self.share}
        removed = 1 - self.kept / max(1, self.total)
        forced = self.forced / max(1, self.total)
        return {**label, "retrievals_over_budget": self.over, "pass_applied": self.applied,
                "over_budget_share": round(forced, 4), "tokens_removed_share": round(removed, 4),
                "removed_beyond_budget_share": round(removed - forced, 4),
                "contained_duplicates_dropped": self.contained,
                "recall": round(self.hits / max(1, self.gold), 4),
                "random_order_recall": round(self.random_hits / max(1, self.gold), 4)}


def _contained(detail: str) -> int:
    m = re.search(r"dedupe dropped (\d+) contained", detail)
    return int(m.group(1)) if m else 0


def _blind(ids: list[str], bodies: list[str], toks: list[int], budget: int,
           rng: random.Random) -> set[int]:
    """Indices a ranking-blind packer keeps: whole passages in a random order while they fit."""
    sel = select_passages(ids, bodies, toks, [], budget, scores=[rng.random() for _ in ids],
                          duplicates=set())
    return set(sel.kept)


def _kept_ids(sel_kept: Any, ids: list[str]) -> set[str]:
    return {ids[i] for i in sel_kept}


def _bank_pass(acc: _Acc, instructions: str, c_ids: list[str], c_bodies: list[str],
               c_toks: list[int], c_req: set[str], rng: random.Random) -> None:
    """The top-50 documents sent through the real ``prune_rag`` as ``<document id=...>`` chunks
    of a user message, at the default policy budget."""
    chunks = [f'<document id="{a}">{b}</document>' for a, b in zip(c_ids, c_bodies)]
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": (
        instructions + "\n" + "\n".join(chunks))}]}
    ctx = Context(RewriteSettings.model_validate({"prune_rag": True}), session=MappingProxyType({}))
    out, edits = prune_rag.run(wire.parse(body, "openai"), ctx)
    sent = wire.render(out)["messages"][0]["content"]
    e = edits[0]
    total = sum(c_toks)
    hits = sum(1 for i, d in enumerate(c_ids) if d in c_req and c_bodies[i] in sent)
    blind = _kept_ids(_blind(c_ids, c_bodies, c_toks, DEFAULT_BUDGET, rng), c_ids)
    acc.add(DEFAULT_BUDGET, total, e.tokens_after if e.applied else total, e, len(c_req), hits,
            len(c_req & blind))


def banking(quick: bool) -> dict[str, Any]:
    """Required-document recall vs tokens removed on the tau2 banking knowledge base (module
    docstring), each point with what the budget forced (``_Acc.point``). The whole-KB and top-50
    curves use ``select_passages`` (the pass's selection; the KB is scored once per task); the
    default-budget point sends the top 50 through the real pass."""
    docs = data.banking_docs()
    tasks = data.banking_tasks()
    if quick:
        tasks = tasks[:25]
    ids = [d["id"] for d in docs]
    bodies = [f"{d['title']}\n{d['content']}" for d in docs]
    toks = [count_tokens(b) for b in bodies]
    corpus = [terms(b) for b in bodies]
    kb_dups = near_duplicates(bodies, [0.0] * len(bodies))
    total = sum(toks)
    kb = {s: _Acc(share=s) for s in KB_SHARES}
    top = {s: _Acc(share=s) for s in TOP50_SHARES}
    default = _Acc(budget=DEFAULT_BUDGET)
    retrieval_hits = retrieval_gold = 0
    for n, task in enumerate(tasks):
        rng = random.Random(n)
        q = terms(task["instructions"])
        req = set(task["required_documents"])
        scores = bm25_scores(corpus, q)
        for share, acc in kb.items():
            budget = int(share * total)
            sel = select_passages(ids, bodies, toks, q, budget, scores=scores, duplicates=kb_dups)
            blind = _kept_ids(_blind(ids, bodies, toks, budget, rng), ids)
            acc.add(budget, total, sel.tokens_after, None, len(req),
                    len(req & _kept_ids(sel.kept, ids)), len(req & blind))
            acc.contained += len(sel.duplicates)
        order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:50]
        c_ids = [ids[i] for i in order]
        c_req = req & set(c_ids)
        retrieval_hits += len(c_req)
        retrieval_gold += len(req)
        c_bodies = [bodies[i] for i in order]
        c_toks = [toks[i] for i in order]
        for share, acc in top.items():
            budget = int(share * sum(c_toks))
            sel = select_passages(c_ids, c_bodies, c_toks, q, budget)
            blind = _kept_ids(_blind(c_ids, c_bodies, c_toks, budget, rng), c_ids)
            acc.add(budget, sum(c_toks), sel.tokens_after, None, len(c_req),
                    len(c_req & _kept_ids(sel.kept, c_ids)), len(c_req & blind))
            acc.contained += len(sel.duplicates)
        _bank_pass(default, task["instructions"], c_ids, c_bodies, c_toks, c_req, rng)
    return {
        "tasks": len(tasks), "documents": len(docs), "kb_tokens": total,
        "kb_contained_duplicates": len(kb_dups),
        "whole_kb_curve": [a.point() for a in kb.values()],
        "bm25_top50_retrieval_recall": round(retrieval_hits / max(1, retrieval_gold), 4),
        "top50_curve": [a.point() for a in top.values()],
        "top50_pass_default_budget": default.point(),
    }


def _nq_case(rows: list[dict[str, Any]], i: int) -> tuple[str, list[tuple[str, str]], str]:
    """``(question, [(id, passage)] in shuffled order, gold id)`` for question ``i``."""
    rng = random.Random(i)
    others = rng.sample([j for j in range(len(rows)) if j != i], 19)
    passages = [rows[i]["gold"]] + [rows[j]["gold"] for j in others]
    texts = [f"{p['title']}\n{p['text']}" for p in passages]
    order = list(range(20))
    rng.shuffle(order)
    items = [(str(k + 1), texts[o]) for k, o in enumerate(order)]
    gold_id = str(order.index(0) + 1)
    return rows[i]["question"], items, gold_id


def _nq_one(acc: _Acc, budget: int, body: dict[str, Any], ids: list[str], toks: list[int],
            gold: int, bodies: list[str], rng: random.Random) -> None:
    """Send one NQ case through the real pass at ``budget``; add it to ``acc``."""
    total = sum(toks)
    ctx = Context(RewriteSettings.model_validate({"prune_rag": True, "rag_budget_tokens": budget}),
                  session=MappingProxyType({}))
    out, edits = prune_rag.run(wire.parse(body, "openai"), ctx)
    sent = wire.render(out)["messages"][0]["content"]
    e = edits[0]
    blind = _blind(ids, bodies, toks, budget, rng)
    acc.add(budget, total, e.tokens_after if e.applied else total, e, 1,
            int(bodies[gold] in sent),  # the gold text, under any id (a copy may stand in)
            int(gold in blind))


def nq(quick: bool) -> dict[str, Any]:
    """Gold-passage recall among 20 passages sent through the real ``prune_rag`` pass as
    ``<document id=...>`` chunks of a user message (injected retrieval), at the default policy
    budget and over a curve of budgets (shares of each question's passage tokens).

    Per point: ``over_budget_share`` — passage tokens above the budget (what the budget forces);
    ``tokens_removed_share`` — what the pass removed; ``removed_beyond_budget_share`` — the
    difference (whole-passage packing slack plus duplicates); ``recall`` vs
    ``random_order_recall`` (the same whole-passage packing in a random order: what a
    ranking-blind pass would keep at that budget). ``pass_applied`` must equal
    ``retrievals_over_budget`` (the pass acts on every retrieval over budget, never under).
    """
    rows = data.nq_rows()
    picks = range(0, len(rows), 13) if quick else range(len(rows))
    default = _Acc(budget=DEFAULT_BUDGET)
    curve = {s: _Acc(share=s) for s in NQ_SHARES}
    for i in picks:
        question, items, gold_id = _nq_case(rows, i)
        ids = [a for a, _ in items]
        bodies = [b for _, b in items]
        chunks = [f'<document id="{a}">{b}</document>' for a, b in items]
        toks = [count_tokens(c) for c in chunks]
        total = sum(toks)
        gold = ids.index(gold_id)
        text = "Answer from these documents.\n" + "\n".join(chunks) + f"\nQuestion: {question}"
        body = {"model": "gpt-x", "messages": [{"role": "user", "content": text}]}
        rng = random.Random(i)
        _nq_one(default, DEFAULT_BUDGET, body, ids, toks, gold, bodies, rng)
        for share, acc in curve.items():
            _nq_one(acc, max(1, int(share * total)), body, ids, toks, gold, bodies, rng)
    return {
        "questions": len(picks),
        "pass_default_budget": default.point(),
        "curve": [a.point() for a in curve.values()],
    }
