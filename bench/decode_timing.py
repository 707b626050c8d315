"""Timing an in-process engine's decode, shared by the decode benchmarks
(``engine_speculative``, ``decode_sections``, ``verify_head``, ``int4_candidates``,
``screened_head_fallback``).

- ``run_batch``: prompts run concurrently through ``Engine.generate``; per request, TPOT (s) =
  (last token time - first token time) / (tokens after the first event), from the streamed outputs;
- ``mean_tpot``: the mean of the requests that produced tokens after their first event;
- ``spec_off``: the engine's speculative decoder detached for a block;
- ``spec_figures``: acceptance figures from the engine's ``stats()`` counters since a snapshot.

Its own module so that ``engine_speculative`` and ``decode_sections`` (which use each other's
sections) both import it rather than each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


async def _one(eng: Any, ids: list[int], params: Any, keep_ids: bool = False) -> dict[str, Any]:
    first = last = None
    n = 0
    got: list[int] = []
    async for out in eng.generate(ids, params):
        got += out.new_token_ids
        now = time.perf_counter()
        if out.new_token_ids:
            if first is None:
                first, n0 = now, len(out.new_token_ids)
            last = now
            n += len(out.new_token_ids)
    tpot = (last - first) / (n - n0) if first is not None and n > n0 else None  # type: ignore[operator]
    row: dict[str, Any] = {"tpot_s": tpot or 0.0, "tokens": n, "ok": tpot is not None}
    if keep_ids:
        row["ids"] = got
    return row


def run_batch(eng: Any, prompts: list[list[int]], params: Any,
              keep_ids: bool = False) -> list[dict[str, Any]]:
    """Run ``prompts`` concurrently; per-request TPOT (s) and token counts (+ ``ids``, the
    output tokens, with ``keep_ids``)."""
    async def all_() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*[_one(eng, p, params, keep_ids) for p in prompts]))
    return asyncio.run(all_())


def mean_tpot(rows: list[dict[str, float]]) -> float:
    vals = [r["tpot_s"] for r in rows if r["ok"]]
    return sum(vals) / len(vals) if vals else float("nan")


@contextmanager
def spec_off(eng: Any) -> Iterator[None]:
    """Detach ``eng``'s speculative decoder while the block runs (the engine must be idle)."""
    saved, eng.spec = eng.spec, None
    try:
        yield
    finally:
        eng.spec = saved


def spec_figures(eng: Any, before: dict[str, Any]) -> dict[str, float]:
    st = eng.stats()
    drafts = st["spec_num_drafts"] - before.get("spec_num_drafts", 0)
    prop = st["spec_num_draft_tokens"] - before.get("spec_num_draft_tokens", 0)
    acc = st["spec_num_accepted_tokens"] - before.get("spec_num_accepted_tokens", 0)
    per_pos = [st[k] - before.get(k, 0) for k in sorted(st) if k.startswith("spec_accepted_pos_")]
    steps = st["spec_decode_steps"] - before.get("spec_decode_steps", 0)
    no_draft = st["spec_no_draft_steps"] - before.get("spec_no_draft_steps", 0)
    return {"acceptance_rate": round(acc / prop, 3) if prop else 0.0,
            "mean_accepted_len": round(1 + acc / drafts, 3) if drafts else 0.0,
            "drafts": drafts, "draft_tokens": prop,
            "accepted_per_position": [round(n / drafts, 3) if drafts else 0.0 for n in per_pos],
            "no_draft_share": round(no_draft / steps, 3) if steps else 0.0}
