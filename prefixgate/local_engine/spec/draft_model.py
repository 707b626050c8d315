"""A draft model for speculative decoding: a smaller model sharing the target's tokenizer.

The draft model keeps its own KV pool and request table (it never touches the target's). Per
request it remembers which tokens it has computed; each ``propose`` first rolls back whatever the
target rejected (tokens no longer a prefix of the request), prefills the new tokens in one chunk,
then decodes ``k`` tokens one at a time, sampling each from ``q`` — the draft distribution under
the request's own sampling params (``sampler.probs_of``) — so the verifier can apply
``min(1, p/q)`` (``spec.decode.verify_sampled``). Greedy requests draft the argmax and carry no
``q``. Any engine-loadable checkpoint works; its vocabulary must equal the target's.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import common_prefix_len
from prefixgate.local_engine.model.llama import load_model
from prefixgate.local_engine.sched.model_runner import ModelRunner
from prefixgate.local_engine.sched.sampler import is_greedy, probs_of
from prefixgate.local_engine.sched.scheduler import ScheduledSeq
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.drafters import Draft


class _Shadow:
    """The draft model's view of one request: tokens, their slots, the table row."""

    def __init__(self, row: int) -> None:
        self.row: int | None = row
        self.token_ids: list[int] = []
        self.slots: list[int] = []
        self.num_computed = 0


class DraftModelDrafter:
    """Proposes ``k`` tokens by running the draft model (see module docstring).

    ``num_slots``: the draft KV pool size (tokens, all requests together); a request that does
    not fit gets no draft. Raises ``ValueError`` when the vocabularies differ.
    """

    name = "draft"

    def __init__(self, model_path: str, device: torch.device, dtype: torch.dtype,
                 max_context_len: int, target_vocab: int, max_requests: int = 64,
                 num_slots: int = 65536) -> None:
        self.model = load_model(model_path, device, dtype)
        args = self.model.args
        if args.vocab_size != target_vocab:
            raise ValueError(f"draft vocab {args.vocab_size} != target vocab {target_vocab}")
        ctx = min(max_context_len, args.max_position_embeddings)
        self.pool = KVPool(args.num_layers, num_slots, args.num_kv_heads, args.head_dim, dtype,
                           device)
        self.table = ReqToTokenTable(max_requests, ctx, device)
        self.runner = ModelRunner(self.model, self.pool, self.table, ctx, device, dtype)
        self.ctx = ctx
        self._state: dict[str, _Shadow] = {}

    def _shadow(self, seq: Sequence) -> _Shadow | None:
        sh = self._state.get(seq.request_id)
        if sh is None:
            if self.table.free_rows == 0:
                return None
            sh = self._state[seq.request_id] = _Shadow(self.table.acquire())
        return sh

    def _forward(self, sh: _Shadow, n: int) -> torch.Tensor:
        """Compute ``sh``'s next ``n`` tokens (slots allocated here); logits of the last."""
        start = len(sh.slots)
        new = self.pool.page_slots(self.pool.alloc_pages(n))
        sh.slots.extend(new)
        assert sh.row is not None
        self.table.set(sh.row, start, new)
        item = ScheduledSeq(cast(Any, sh), start, n, is_decode=n == 1 and start > 0)
        logits, _ = self.runner.run([item])
        sh.num_computed = start + n
        return logits[-1:]

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """Up to ``k`` draft tokens for ``seq`` (None when the draft pool / rows are full)."""
        target = seq.token_ids
        if k < 1 or len(target) + k > self.ctx:
            return None
        sh = self._shadow(seq)
        if sh is None:
            return None
        keep = common_prefix_len(sh.token_ids[: sh.num_computed], target[:-1])
        self.pool.free(sh.slots[keep:])
        del sh.slots[keep:]
        sh.num_computed = keep
        sh.token_ids = list(target)
        if self.pool.free_slots < len(target) - keep + k:
            return None
        greedy = is_greedy(seq.params)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        logits = self._forward(sh, len(target) - keep)
        for i in range(k):
            q = probs_of(logits, seq.params)[0]
            tok = int(q.argmax()) if greedy else int(
                torch.multinomial(q, 1, generator=seq.generator).item())
            tokens.append(tok)
            qs.append(q)
            sh.token_ids.append(tok)
            if i + 1 < k:
                logits = self._forward(sh, 1)
        return Draft(tokens, None if greedy else torch.stack(qs))

    def release(self, seq: Sequence) -> None:
        """Free the request's draft KV and row."""
        sh = self._state.pop(seq.request_id, None)
        if sh is not None:
            self.pool.free(sh.slots)
            if sh.row is not None:
                self.table.release(sh.row)
