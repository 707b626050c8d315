"""Turns a scheduled step into tensors, runs the model, returns logits (nano-vllm's model_runner).

Packing of one step (``T`` rows): prefill chunks first (one attention group each), then all
decode rows (one attention group; when any decode carries draft tokens, a padded ``verify_group``
holds every decode's newest token + drafts). For every row: its token id, its position (= its
index in its sequence, continuing from the cached length) and the slot its K/V is written to.
"""

from __future__ import annotations

import torch

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.model.attention import AttnMeta, decode_group, prefill_group, verify_group
from prefixgate.local_engine.model.llama import CausalLM, rope_tables
from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sampler import is_greedy, needs_preparing
from prefixgate.local_engine.sched.scheduler import ScheduledSeq


def argmax_suffices(params: SamplingParams) -> bool:
    """True when a request's next token (and its draft verification) reads only the argmax
    of the raw logits: greedy, with no biases, penalties or logits processors."""
    return is_greedy(params) and not needs_preparing(params)


def _wants_prompt_rows(seq: object) -> bool:
    """True while ``seq`` asked for prompt log-probs and has not received them yet (a draft
    model's shadow sequences carry no params)."""
    params = getattr(seq, "params", None)
    return bool(getattr(params, "prompt_logprobs", False)) and not getattr(
        seq, "prompt_logprobs_sent", True)


class ModelRunner:
    """Holds the model, the KV pool, the request→slot table and the RoPE tables."""

    def __init__(self, model: CausalLM, pool: KVPool, table: ReqToTokenTable,
                 max_context_len: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.pool = pool
        self.table = table
        self.device = device
        args = model.args
        self.gqa = args.num_heads // args.num_kv_heads
        self.cos, self.sin = rope_tables(args, max_context_len, dtype, device)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)

    def run(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Forward ``batch``; returns ``(logits [R, vocab] fp32, the items they belong to)``.

        Only items whose sequence has every token computed after this step get logits rows:
        ``item.num_rows`` consecutive rows for a decode carrying a draft (its newest token and
        each draft token), one row otherwise. Items come back in packing order. When every
        such item only needs its rows' argmax (``argmax_suffices``), the model may return
        argmax-exact estimates (``CausalLM.forward``'s ``argmax_only``).

        A prefill item whose request asked for ``prompt_logprobs`` also gets the log-softmax
        rows of its prompt positions (from ``params.prompt_logprobs_start`` on), stored in
        ``seq.prompt_logprob_parts[first position]``.
        """
        ids: list[int] = []
        positions: list[int] = []
        out_slots: list[int] = []
        groups = []
        logit_rows: list[int] = []
        with_logits: list[ScheduledSeq] = []
        prompt_rows: list[tuple[ScheduledSeq, int, int]] = []  # item, first packed row, rows
        row_of: dict[int, int] = {}  # id(item) -> its first packed row
        decode_items = [it for it in batch if it.is_decode]
        prefill_items = [it for it in batch if not it.is_decode]
        table = self.table.table
        for it in prefill_items + decode_items:
            seq, s, e = it.seq, it.start, it.start + it.n
            rows = it.num_rows
            row_of[id(it)] = len(ids)
            if it.draft is None and _wants_prompt_rows(seq):  # a full hit's last token too
                lo = max(s, seq.params.prompt_logprobs_start)
                if lo < min(e, seq.num_prompt):
                    prompt_rows.append((it, len(ids) + lo - s, min(e, seq.num_prompt) - lo))
            ids.extend(seq.token_ids[s:e])
            if it.draft is not None:
                ids.extend(it.draft.tokens)
            positions.extend(range(s, s + rows))
            out_slots.extend(seq.slots[s:s + rows])
            if e == len(seq.token_ids):
                first = len(ids) - (rows if it.draft is not None else 1)
                logit_rows.extend(range(first, len(ids)))
                with_logits.append(it)
        row = 0
        for it in prefill_items:
            assert it.seq.row is not None
            slots = table[it.seq.row, : it.start + it.n]
            groups.append(prefill_group(row, it.start, it.n, slots, self.gqa, self.device))
            row += it.n
        if decode_items:
            rows_t = self._tensor([it.seq.row for it in decode_items])  # type: ignore[misc]
            ns = [it.num_rows for it in decode_items]
            lengths = [it.start + k for it, k in zip(decode_items, ns)]
            kv_index = table[:, : max(lengths)].index_select(0, rows_t)
            if max(ns) == 1:
                groups.append(decode_group(row, lengths, kv_index, self.device))
            else:
                groups.append(verify_group(row, [it.start for it in decode_items], ns, kv_index,
                                           self.gqa, self.device))
        pos_t = self._tensor(positions)
        meta = AttnMeta(
            cos=self.cos.index_select(0, pos_t).unsqueeze(1),
            sin=self.sin.index_select(0, pos_t).unsqueeze(1),
            out_slots=self._tensor(out_slots),
            groups=groups,
            gqa=self.gqa,
        )
        # a draft model's shadow sequences carry no params: it needs the full distribution
        params = [getattr(it.seq, "params", None) for it in with_logits]
        argmax_only = not prompt_rows and all(
            isinstance(p, SamplingParams) and argmax_suffices(p) for p in params)
        r = len(logit_rows)
        extra = [first + i for _, first, n in prompt_rows for i in range(n)]
        logits = self.model(self._tensor(ids), meta, self.pool, self._tensor(logit_rows + extra),
                            argmax_only=argmax_only)
        at = r
        for it, first, n in prompt_rows:
            pos = it.start + first - row_of[id(it)]
            it.seq.prompt_logprob_parts[pos] = torch.log_softmax(
                logits[at:at + n].float(), dim=-1).cpu()
            at += n
        return logits[:r], with_logits
