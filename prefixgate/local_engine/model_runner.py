"""Turns a scheduled step into tensors, runs the model, returns logits (nano-vllm's model_runner).

Packing of one step (``T`` rows): prefill chunks first (one attention group each), then all
decode rows (one attention group). For every row: its token id, its position (= its index in its
sequence, continuing from the cached length) and the slot its K/V is written to.
"""

from __future__ import annotations

import torch

from prefixgate.local_engine.attention import AttnMeta, decode_group, prefill_group
from prefixgate.local_engine.kv_pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.model import CausalLM, rope_tables
from prefixgate.local_engine.scheduler import ScheduledSeq
from prefixgate.local_engine.sequence import Sequence


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

    def run(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, list[Sequence]]:
        """Forward ``batch``; returns ``(logits [R, vocab] fp32, the R sequences they belong to)``.

        Only sequences whose every token is computed after this step get a logits row.
        """
        ids: list[int] = []
        positions: list[int] = []
        out_slots: list[int] = []
        groups = []
        logit_rows: list[int] = []
        sampled: list[Sequence] = []
        decode_items = [it for it in batch if it.n == 1 and it.start > 0]
        prefill_items = [it for it in batch if not (it.n == 1 and it.start > 0)]
        table = self.table.table
        for it in prefill_items + decode_items:
            seq, s, e = it.seq, it.start, it.start + it.n
            ids.extend(seq.token_ids[s:e])
            positions.extend(range(s, e))
            out_slots.extend(seq.slots[s:e])
            if e == len(seq.token_ids):
                logit_rows.append(len(ids) - 1)
                sampled.append(seq)
        row = 0
        for it in prefill_items:
            assert it.seq.row is not None
            slots = table[it.seq.row, : it.start + it.n]
            groups.append(prefill_group(row, it.start, it.n, slots, self.gqa, self.device))
            row += it.n
        if decode_items:
            rows = self._tensor([it.seq.row for it in decode_items])  # type: ignore[misc]
            lengths = [it.start + 1 for it in decode_items]
            kv_index = table[:, : max(lengths)].index_select(0, rows)
            groups.append(decode_group(row, lengths, kv_index, self.device))
        pos_t = self._tensor(positions)
        meta = AttnMeta(
            cos=self.cos.index_select(0, pos_t).unsqueeze(1),
            sin=self.sin.index_select(0, pos_t).unsqueeze(1),
            out_slots=self._tensor(out_slots),
            groups=groups,
            gqa=self.gqa,
        )
        logits = self.model(self._tensor(ids), meta, self.pool, self._tensor(logit_rows))
        return logits, sampled
