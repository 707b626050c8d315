"""RAG-pruning evaluation: required/gold passage recall vs passage tokens removed.

- tau2 banking knowledge base (698 documents, 77 tasks with ``required_documents``): each task's
  instructions are the query, (a) against the whole knowledge base, (b) against the 50 documents
  a BM25 retriever returns for it (recall counted over the required documents inside those 50).
- NQ-open oracle: each question's gold passage among 19 distractors (other questions' gold
  passages), sent through the real ``prune_rag`` pass as ``<document id=...>`` chunks.
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

from bench import pruning_data as data
from config.schema import RewriteSettings
from rewriter import prune_rag, wire
from rewriter.bm25 import bm25_scores, terms
from rewriter.dedupe import near_duplicates
from rewriter.prune_rag import select_passages
from rewriter.tokens import count_tokens
from rewriter.types import Context

KB_SHARES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
TOP50_SHARES = (0.2, 0.3, 0.5, 0.7)
NQ_SHARES = (0.1, 0.2, 0.3, 0.5)


def _point(hits: int, gold: int, kept: int, total: int, **extra: Any) -> dict[str, Any]:
    return {**extra, "recall": round(hits / max(1, gold), 4),
            "tokens_removed_share": round(1 - kept / max(1, total), 4)}


def banking(quick: bool) -> dict[str, Any]:
    """Recall vs kept tokens on the tau2 banking knowledge base (see module docstring)."""
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
    kb = {s: [0, 0, 0, 0] for s in KB_SHARES}  # hits, gold, kept tokens, all tokens
    top = {s: [0, 0, 0, 0] for s in TOP50_SHARES}
    default = [0, 0, 0, 0]
    retrieval_hits = retrieval_gold = 0
    for task in tasks:
        q = terms(task["instructions"])
        req = set(task["required_documents"])
        scores = bm25_scores(corpus, q)
        for share in KB_SHARES:
            sel = select_passages(ids, bodies, toks, q, int(share * total), scores=scores,
                                  duplicates=kb_dups)
            kept = {ids[i] for i in sel.kept}
            acc = kb[share]
            acc[0] += len(req & kept)
            acc[1] += len(req)
            acc[2] += sel.tokens_after
            acc[3] += total
        order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:50]
        c_ids = [ids[i] for i in order]
        c_req = req & set(c_ids)
        retrieval_hits += len(c_req)
        retrieval_gold += len(req)
        c_bodies = [bodies[i] for i in order]
        c_toks = [toks[i] for i in order]
        c_total = sum(c_toks)
        budgets: list[tuple[list[int], int]] = [(top[s], int(s * c_total)) for s in TOP50_SHARES]
        for acc, budget in [*budgets, (default, 2000)]:
            sel = select_passages(c_ids, c_bodies, c_toks, q, budget)
            kept = {c_ids[i] for i in sel.kept}
            acc[0] += len(c_req & kept)
            acc[1] += len(c_req)
            acc[2] += sel.tokens_after
            acc[3] += c_total
    return {
        "tasks": len(tasks), "documents": len(docs), "kb_tokens": total,
        "kb_near_duplicates": len(kb_dups),
        "whole_kb_curve": [_point(a[0], a[1], a[2], a[3], budget_share=s)
                           for s, a in kb.items()],
        "bm25_top50_retrieval_recall": round(retrieval_hits / max(1, retrieval_gold), 4),
        "top50_curve": [_point(a[0], a[1], a[2], a[3], budget_share=s) for s, a in top.items()],
        "top50_default_budget_2000": _point(*default),
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


def nq(quick: bool) -> dict[str, Any]:
    """Gold-passage recall among 20 passages; curve from ``select_passages`` and the real pass
    at the default 2,000-token budget and at half the passage tokens."""
    rows = data.nq_rows()
    picks = range(0, len(rows), 13) if quick else range(len(rows))
    curve = {s: [0, 0, 0, 0] for s in NQ_SHARES}
    e2e = {"default_2000": [0, 0, 0, 0], "half": [0, 0, 0, 0]}
    for i in picks:
        question, items, gold = _nq_case(rows, i)
        ids = [a for a, _ in items]
        bodies = [b for _, b in items]
        chunks = [f'<document id="{a}">{b}</document>' for a, b in items]
        toks = [count_tokens(c) for c in chunks]
        total = sum(toks)
        q = terms(question)
        scores = bm25_scores([terms(b) for b in bodies], q)
        for share in NQ_SHARES:
            sel = select_passages(ids, bodies, toks, q, int(share * total), scores=scores)
            acc = curve[share]
            acc[0] += int(gold in {ids[k] for k in sel.kept})
            acc[1] += 1
            acc[2] += sel.tokens_after
            acc[3] += total
        text = "Answer from these documents.\n" + "\n".join(chunks) + f"\nQuestion: {question}"
        body = {"model": "gpt-x", "messages": [{"role": "user", "content": text}]}
        for label, budget in (("default_2000", 2000), ("half", total // 2)):
            ctx = Context(RewriteSettings.model_validate(
                {"prune_rag": True, "rag_budget_tokens": budget}), session=MappingProxyType({}))
            out, edits = prune_rag.run(wire.parse(body, "openai"), ctx)
            sent = wire.render(out)["messages"][0]["content"]
            acc = e2e[label]
            acc[0] += int(f'<document id="{gold}">' in sent)
            acc[1] += 1
            acc[2] += sum(e.tokens_after for e in edits) if edits[0].applied else total
            acc[3] += total
    return {
        "questions": len(picks),
        "curve": [_point(a[0], a[1], a[2], a[3], budget_share=s) for s, a in curve.items()],
        "pass_default_budget_2000": _point(*e2e["default_2000"]),
        "pass_half_budget": _point(*e2e["half"]),
    }
