"""Sections of ``bench/engine_speculative.py`` added by issue 27: tool-call drafts and 4-bit.

- ``tool_drafts``: tool-call outputs (``tool_draft_prompts``: tau-bench conversations with their
  tools and earlier calls, the answer opened with ``<tool_call>``), greedy. One engine with
  ``ngram+suffix+tools``; per prompt group: speculative with tool drafts, speculative without
  them (``ngram+suffix`` drafter swapped in), plain; outputs compared token for token.
- ``int4``: with ``--only int4 --int4-from FILE``, the section is ``int4_summary`` of
  ``bench/int4_candidates.py``'s JSON (whole-model batch-1 decode with each PyPI 4-bit CPU kernel
  against llama.cpp Q4_1 and our int8, measured in one run); without it, the older kernel
  probe: torch's ``_weight_int4pack_mm_for_cpu`` (group-wise asymmetric, torchao's CPU int4
  layout uses it) timed against oneDNN fp32 and the int8 product on SmolLM2's gate|up shape at
  one row, with fp32 activations (a scalar fallback) and with bf16 activations (its vectorised
  path). (``_dyn_quant_matmul_4bit`` is KleidiAI, Arm only.)
"""

from __future__ import annotations

import time
from typing import Any


def _best_us(fn: Any, n: int = 30) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return round(best * 1e6, 1)


def int4_probe(out_f: int = 3072, in_f: int = 576, group: int = 32) -> dict[str, Any]:
    """Microseconds per ``[1, in_f] @ [out_f, in_f].T`` for fp32 (oneDNN packed), int8 and
    torch's int4 CPU kernel, and the int4 kernel's max relative error vs its dequantized
    weights."""
    import torch
    import torch.nn.functional as F

    from prefixgate.local_engine.model.quant.cpu_linear import PackedLinear
    from prefixgate.local_engine.model.quant.int8 import Int8Linear

    torch.manual_seed(0)
    w, x = torch.randn(out_f, in_f) * 0.02, torch.randn(1, in_f)
    wg = w.view(out_f, in_f // group, group)
    mn = wg.amin(-1)
    sc = ((wg.amax(-1) - mn) / 15).clamp_min(1e-9)
    q = torch.round((wg - mn[..., None]) / sc[..., None]).clamp(0, 15).to(torch.int32).view(out_f, in_f)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_zeros = torch.stack([sc, mn + 8 * sc], -1).transpose(0, 1).contiguous()  # w = (q-8)s + z

    def int4() -> Any:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_zeros)

    xb, szb = x.bfloat16(), scales_zeros.bfloat16()

    def int4_bf16() -> Any:  # the kernel's vectorised path: bf16 activations and scales
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, group, szb)

    deq = (q.view(out_f, in_f // group, group).float() * sc[..., None] + mn[..., None]).view(out_f, in_f)
    ref = F.linear(x, deq)
    p32, p8 = PackedLinear(w, None), Int8Linear(w, None)
    return {"shape": [out_f, in_f], "group": group,
            "us_per_row": {"fp32_onednn": _best_us(lambda: p32(x)), "int8": _best_us(lambda: p8(x)),
                           "int4_torch": _best_us(int4), "int4_torch_bf16_act": _best_us(int4_bf16)},
            "int4_max_rel_err": float((int4() - ref).abs().max() / ref.abs().max()),
            "int4_bf16_act_max_rel_err": float((int4_bf16().float() - ref).abs().max() / ref.abs().max()),
            "dyn_quant_matmul_4bit": "not usable on x86 here: _dyn_quant_pack_4bit_weight raises "
                                     "'Expected bias length to match output dimension' (KleidiAI, Arm)"}


def int4_summary(cand: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures, details) of the int4 section from ``bench/int4_candidates.py``'s JSON: the
    fastest int4 engine's batch-1 decode against llama.cpp Q4_1's best poll setting and our
    int8, with its greedy agreement; ``adopted``: whether it reached llama.cpp (the issue's bar
    for wiring an int4 engine mode)."""
    best = cand["best_int4"]
    tok_s = cand["decode_tok_s_b1"]
    llama = max((v for v in cand["llamacpp_q4_1_tok_s"].values() if v), default=None)
    fig = {"kernels_tried": [k for k in cand["us_per_row"]["gate_up"] if k.startswith("int4")],
           "best_int4": best, "best_int4_tok_s_b1": tok_s[best], "int8_tok_s_b1": tok_s["int8"],
           "fp32_tok_s_b1": tok_s["fp32"], "llamacpp_q4_1_tok_s": llama,
           "best_int4_top1_agreement": cand["first_token_agreement_vs_fp32"][best],
           "adopted": bool(llama is not None and tok_s[best] >= llama)}
    return fig, cand


def tool_drafts(base: dict[str, Any], n_b1: int, n_b8: int, max_tokens: int,
                cost_curve: list[tuple[int, float]] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures, details) of the tool-call section (module docstring)."""
    from bench.decode_timing import mean_tpot, run_batch, spec_figures, spec_off
    from bench.tool_draft_prompts import FRAME, tool_call_chats
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat
    from prefixgate.local_engine.spec.drafters import ChainDrafter

    eng = Engine(EngineConfig(**{**base, "speculative": "ngram+suffix+tools"}))
    assert eng.spec is not None
    eng.spec.cost_curve = sorted(cost_curve) if cost_curve else None
    tok = eng.tokenizer
    frame = tok.encode(FRAME, add_special_tokens=False)
    ids = [encode_chat(tok, m, t) + frame for m, t in tool_call_chats(n_b1 + n_b8)]
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    with_tools = eng.spec.drafter
    assert isinstance(with_tools, ChainDrafter)
    no_tools = ChainDrafter([d for d in with_tools.drafters if d.name != "tools"])
    figures: dict[str, Any] = {}
    details: dict[str, Any] = {"prompts": len(ids), "prompt_tokens_mean": round(sum(map(len, ids)) / len(ids))}
    identical = True
    for label, prompts, batch in (("b1", ids[:n_b1], 1), ("b8", ids[n_b1:n_b1 + n_b8], 8)):
        if not prompts:
            continue
        rows: dict[str, list[dict[str, Any]]] = {"spec_tools": [], "spec_no_tools": [], "plain": []}
        stats: dict[str, dict[str, Any]] = {}
        for g in range(0, len(prompts), batch):
            group = prompts[g:g + batch]
            for name, drafter in (("spec_tools", with_tools), ("spec_no_tools", no_tools)):
                eng.spec.drafter = drafter
                before = eng.stats()
                rows[name] += run_batch(eng, group, greedy, keep_ids=True)
                st = spec_figures(eng, before)
                acc = stats.setdefault(name, {"drafts": 0, "accepted": 0, "draft_tokens": 0})
                acc["drafts"] += st["drafts"]
                acc["draft_tokens"] += st["draft_tokens"]
                acc["accepted"] += round((st["mean_accepted_len"] - 1) * st["drafts"]) if st["drafts"] else 0
            eng.spec.drafter = with_tools
            with spec_off(eng):
                rows["plain"] += run_batch(eng, group, greedy, keep_ids=True)
        for name in ("spec_tools", "spec_no_tools"):
            identical &= [r["ids"] for r in rows[name]] == [r["ids"] for r in rows["plain"]]
        tp = {k: round(mean_tpot(v) * 1000, 2) for k, v in rows.items()}
        mal = {k: round(1 + s["accepted"] / s["drafts"], 3) if s["drafts"] else 0.0 for k, s in stats.items()}
        figures[f"tpot_ratio_{label}"] = round(tp["plain"] / tp["spec_tools"], 3)
        figures[f"mean_accepted_len_{label}"] = mal["spec_tools"]
        details[label] = {"tpot_ms": tp, "mean_accepted_len": mal, "draft_stats": stats,
                          "sample_output": tok.decode(rows["plain"][0]["ids"])[:160]}
    figures["identical_outputs"] = identical
    eng.shutdown()
    return figures, details
