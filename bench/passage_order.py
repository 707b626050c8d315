"""Turn-2 prefix reuse on the local engine when injected passages come back re-ordered.

    .venv/bin/python bench/passage_order.py [--model DIR] [--out FILE]

For each markup form (XML-like tags with ids, ``[n]`` lists, ``Document N:`` headers, markdown
sections, a JSON array of documents; Anthropic ``document`` blocks in the first user turn, sent
by an Anthropic client and bridged to the engine's Chat API) and each place (the system prompt; the first user message
under a ``Retrieved documents:`` line), a two-turn conversation is rewritten by the real pipeline
(``rewriter.rewrite_request``, provider ``radix``, session memory carried like the proxy does)
and sent to the local engine (SmolLM2-135M-Instruct, in-process, greedy, ``max_tokens=1``):

* turn 1: passages a, b, c, d;
* turn 2: the same conversation one exchange later, the retrieval re-ranked to c, a, d, b
  (``reorder``) or c, e, a, d, b with a new passage e (``reorder_plus_new``).

``turn2_cached_share`` = the engine's cached prompt tokens on turn 2 / turn 1's prompt tokens,
with the stabiliser on and (``baseline``) off. Every run starts with its own salt line, so runs
never share a cached prefix. Goal: >= 0.8 for every form with ``reorder``. Writes
``bench/results/passage_order.json`` and the ``passage_order`` figure of
``bench/results/cache_planning.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
FORMS = ("tag", "numbered", "header", "markdown", "json", "document_blocks")
TEXTS = {
    "a": "The Rhine flows through six countries and ends in the North Sea near Rotterdam.",
    "b": "Basalt forms when lava cools quickly at the surface of the earth.",
    "c": "The first transatlantic telegraph cable was completed in the year 1858.",
    "d": "Honey bees communicate the direction of food with a waggle dance.",
    "e": "Copper turns green over time because of a patina of copper carbonate.",
}
NUM = {k: i + 11 for i, k in enumerate(sorted(TEXTS))}


def retrieval(form: str, keys: list[str]) -> str:
    """The passages ``keys`` in ``form``, each with its own label."""
    if form == "tag":
        return "\n".join(f'<document id="{k}">{TEXTS[k]}</document>' for k in keys)
    if form == "numbered":
        return "\n".join(f"[{NUM[k]}] {TEXTS[k]}" for k in keys)
    if form == "header":
        return "\n".join(f"Document {k}: {TEXTS[k]}" for k in keys)
    if form == "markdown":
        return "\n\n".join(f"## Source {k}\n\n{TEXTS[k]}" for k in keys)
    return json.dumps([{"id": k, "content": TEXTS[k]} for k in keys], indent=1)


def documents_conversation(keys: list[str], turn: int, salt: int) -> dict[str, Any]:
    """A Messages body whose first user turn carries Anthropic ``document`` blocks."""
    docs = [{"type": "document", "title": k,
             "source": {"type": "text", "media_type": "text/plain", "data": TEXTS[k]}}
            for k in keys]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [
        *docs, {"type": "text", "text": "Which passage mentions a year?"}]}]
    if turn == 2:
        msgs += [{"role": "assistant", "content": "The telegraph passage."},
                 {"role": "user", "content": "And which one is about animals?"}]
    return {"model": "local", "max_tokens": 1, "messages": msgs,
            "system": f"Run {salt}. You answer questions from the documents."}


def conversation(form: str, where: str, keys: list[str], turn: int, salt: int
                 ) -> dict[str, Any]:
    """A Chat Completions body: turn 1 (one user question) or turn 2 (one exchange later)."""
    docs = "Retrieved documents:\n" + retrieval(form, keys)
    system = f"Run {salt}. You answer questions from the documents, citing their labels."
    question = "Which passage mentions a year?"
    if where == "system":
        msgs = [{"role": "system", "content": f"{system}\n\n{docs}"},
                {"role": "user", "content": question}]
    else:
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"{docs}\n\n{question}"}]
    if turn == 2:
        msgs += [{"role": "assistant", "content": "The telegraph passage."},
                 {"role": "user", "content": "And which one is about animals?"}]
    return {"model": "local", "messages": msgs}


def run_engine(eng: Any, tok: Any, body: dict[str, Any]) -> tuple[int, int]:
    """``(prompt tokens, cached tokens)`` of one greedy 1-token request."""
    from prefixgate.local_engine.engine import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    ids = encode_chat(tok, body["messages"])
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    async def go() -> int:
        async for out in eng.generate(ids, params):
            return int(out.cached_tokens)
        raise RuntimeError("no output")

    return len(ids), asyncio.run(go())


def measure(eng: Any, tok: Any, form: str, where: str, turn2_keys: list[str], stabilise: bool,
            salt: int) -> dict[str, Any]:
    """Rewrite and send turn 1 then turn 2; the turn-2 cached share of turn 1's tokens."""
    from prefixgate.config.schema import RewriteSettings
    from prefixgate.proxy.bridges.anthropic_openai_request import request_to_openai
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    memory: dict[str, Any] = {}
    settings = RewriteSettings(stabilise_passages=stabilise)
    out = []
    blocks = form == "document_blocks"  # Anthropic client, bridged to the engine's Chat API
    for turn, keys in ((1, ["a", "b", "c", "d"]), (2, turn2_keys)):
        body = documents_conversation(keys, turn, salt) if blocks else \
            conversation(form, where, keys, turn, salt)
        r = rewrite_request(body, "anthropic" if blocks else "openai",
                            Context(settings, provider="radix", session=memory))
        memory.update(session_updates(r))
        sent = request_to_openai(r.body) if blocks else r.body
        out.append((run_engine(eng, tok, sent), r.summary()))
    (p1, _), _ = out[0]
    (p2, c2), summary = out[1]
    return {"turn1_prompt_tokens": p1, "turn2_prompt_tokens": p2, "turn2_cached_tokens": c2,
            "turn2_cached_share": round(c2 / p1, 3), "turn2_edits": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path,
                    default=Path(os.environ.get("PREFIXGATE_MODEL_DIR", DEFAULT_MODEL)))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/passage_order.json")
    args = ap.parse_args(argv)
    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(args.model), num_kv_slots=16384,
                              max_context_len=2048))
    tok = eng.tokenizer
    rows: dict[str, Any] = {}
    salt = 0
    for form in FORMS:
        for where in (("user",) if form == "document_blocks" else ("system", "user")):
            for case, keys in (("reorder", ["c", "a", "d", "b"]),
                               ("reorder_plus_new", ["c", "e", "a", "d", "b"])):
                for stabilise in (True, False):
                    salt += 1
                    row = measure(eng, tok, form, where, keys, stabilise, salt)
                    name = f"{form}/{where}/{case}/{'stabilised' if stabilise else 'baseline'}"
                    rows[name] = row
                    print(name, row, flush=True)
    eng.shutdown()
    goal = [r["turn2_cached_share"] for k, r in rows.items()
            if k.endswith("/reorder/stabilised")]
    base = [r["turn2_cached_share"] for k, r in rows.items() if k.endswith("/reorder/baseline")]
    result = {"command": command(__file__, argv),
              "figures": {"min_turn2_cached_share": min(goal),
                          "min_turn2_cached_share_baseline": min(base),
                          "max_turn2_cached_share_baseline": max(base), "runs": rows},
              "setup": {"model": args.model.name, "device": "cpu", "max_tokens": 1,
                        "engine": "local_engine in-process, radix prefix cache"}}
    write_json(args.out, result)
    print("min turn-2 cached share (stabilised, reorder):", min(goal), "baseline max:", max(base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
