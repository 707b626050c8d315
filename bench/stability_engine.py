"""The engine side of ``bench/answer_stability.py``: greedy answers and teacher-forced figures.

One in-process engine (``prefixgate.local_engine``, SmolLM2-135M-Instruct fp32 CPU), span reuse
off (every position is computed on the exact K/V of its own prefix; the radix prefix cache on).
Per request (:meth:`Answers.request`):

1. each reference (the client's body as the engine gets it) is decoded greedily in the prefix
   cache namespace :data:`REF_NS`, so its answer ``A`` never sits in the main namespace;
2. the reference's own rows over ``A`` (``P + A`` with prompt log-probs) and every variant's
   (``Q + A``) are computed in the main namespace, in one continuous batch: what the cache holds
   there is a prefix of some other prompt, never this prompt's answer, so every answer position
   has its row (``missing`` counts any that did not); ``bench/teacher_forced.py`` compares them;
3. the variants that need their own text are decoded greedily in the main namespace — a prefix
   hit on step 2's ``Q + A`` (identical token sequences are decoded once).

Greedy tokens of one continuous batch equal one-at-a-time decoding (checked on 16 corpus prompts,
``bench/answer_stability.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.teacher_forced import IDENTICAL, answer_positions, compare, prompt_rows

REF_NS = b"answer-stability/reference"
"""Prefix-cache namespace (``extra_key``) of the references' greedy decodes."""
NUM_KV_SLOTS = 65536

Key = tuple[int, ...]


class Answers:
    """Greedy completions (one per distinct token sequence) and teacher-forced figures."""

    def __init__(self, model: Path, max_tokens: int) -> None:
        from prefixgate.local_engine.engine import Engine, EngineConfig

        self.eng = Engine(EngineConfig(model_path=str(model), num_kv_slots=NUM_KV_SLOTS,
                                       max_context_len=4096, span_reuse=False))
        self.tok = self.eng.tokenizer
        self.max_tokens = max_tokens
        self.memo: dict[Key, list[int]] = {}
        self.prompt_tokens: list[int] = []

    def ids(self, body: dict[str, Any]) -> Key:
        """The body's prompt token ids, as the engine's server encodes a Chat request."""
        from prefixgate.local_engine.server.chat import encode_chat

        return tuple(encode_chat(self.tok, body["messages"], body.get("tools")))

    def greedy(self, keys: list[Key], extra_key: bytes | None = None) -> None:
        """Decode the sequences of ``keys`` not decoded before, in one continuous batch."""
        from prefixgate.local_engine.engine import SamplingParams

        new = [k for k in dict.fromkeys(keys) if k not in self.memo]
        if not new:
            return
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
        outs = self.eng.generate_batch([list(k) for k in new], [params] * len(new)) \
            if extra_key is None else [self._one(k, params, extra_key) for k in new]
        for k, toks in zip(new, outs):
            self.prompt_tokens.append(len(k))
            self.memo[k] = list(toks)

    def _one(self, key: Key, params: Any, extra_key: bytes) -> list[int]:
        import asyncio

        async def go() -> list[int]:
            toks: list[int] = []
            async for out in self.eng.generate(list(key), params, extra_key=extra_key):
                toks += out.new_token_ids
            return toks
        return asyncio.run(go())

    def text(self, key: Key) -> str:
        """The decoded greedy answer of ``key`` (special tokens dropped)."""
        return str(self.tok.decode(self.memo[key], skip_special_tokens=True))

    def request(self, refs: list[Key], pairs: list[tuple[Key, Key]], decode: list[Key]
                ) -> list[dict[str, Any]]:
        """Steps 1-3 of the module docstring for one request: ``refs`` decoded, then per
        ``(variant, reference)`` of ``pairs`` :func:`bench.teacher_forced.compare`'s figures of
        the variant over the reference's answer (:data:`IDENTICAL` when the tokens are equal),
        then ``decode`` decoded."""
        self.greedy(refs, REF_NS)
        jobs = list(dict.fromkeys([*((r, tuple(self.memo[r])) for r in refs),
                                   *((v, tuple(self.memo[r])) for v, r in pairs if v != r)]))
        got = prompt_rows(self.eng, [list(v) + list(a) for v, a in jobs],
                          [len(v) - 1 for v, _ in jobs])
        rows = dict(zip(jobs, got))
        out = []
        for v, r in pairs:
            a = tuple(self.memo[r])
            if v == r:
                out.append(dict(IDENTICAL, positions=len(a), missing=0))
                continue
            out.append(compare(rows[(r, a)], rows[(v, a)], answer_positions(len(r), len(a)),
                               answer_positions(len(v), len(a)), list(a)))
        self.greedy(decode)
        return out

    def shutdown(self) -> None:
        self.eng.shutdown()
