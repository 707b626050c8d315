"""Speculative decoding and int8 weights vs plain fp32 decode: TPOT on grounded and open outputs.

    .venv/bin/python bench/engine_speculative.py [--quick] [--threads 2] [--no-llamacpp]

Same run, same process, engines built side by side on SmolLM2-135M-Instruct (fp32 unless said):

- knee: decode step time vs rows per step (1 .. 32 requests decoding together, spec off). The
  speculative engines get this curve (``spec_cost_curve``): each step they draft only as many
  tokens as raise expected tokens per step time (``spec.decode.choose_k_cap``), so drafting turns
  itself off where the step is compute-bound. Recorded beside it: ``threshold_rows`` (largest
  row count within ``KNEE_FACTOR`` × a 1-row step) and the draft cap the policy picks at batch
  1 / 8 for high and low acceptance.
- grounded: agent outputs that copy their inputs — prompts from the tau-bench airline trace that
  ask to restate a JSON tool result, to quote a reservation's ids and values, or to answer the
  customer from a tool result. open: open-ended chat (the trace's first customer turns and
  general questions). Greedy, EOS on (plain and speculative give the same tokens: exactness).
  One engine per weight format (``ngram+suffix``, k = ``--k``); each prompt group runs
  speculative first, then plain with the speculative decoder detached (so the suffix index never
  holds a prompt's own earlier output); batch 1 (one request at a time) and batch 8 (8 at once,
  prompts disjoint from batch 1's). TPOT per request = (last token time − first token
  time) / (tokens − 1), from the engine's streamed outputs; the figure is mean TPOT.
- int8: ``quantization="int8"`` decode tokens/s vs fp32 at batch 1 (plain), and greedy top-1
  agreement with fp32 on the first completion token of tau-bench prompts (prefixes of the
  conversations cut at every assistant turn).
- vs_llamacpp: int8 + speculation on the grounded prompts at batch 1 (tokens/s = 1000 / TPOT ms)
  against llama.cpp's plain decode of the same model (Q4_1 GGUF, ``bench/llamacpp_server.py``,
  no busy-polling) on the same prompts over its streaming API, in the same run.

Writes ``bench/results/engine_speculative.json``::

    {"command", "figures": {"grounded": {"tpot_ratio_b1", "tpot_ratio_b8", "acceptance_rate",
     "mean_accepted_len"}, "open": {"tpot_ratio_b1", "tpot_ratio_b8"}, "int8": {"decode_ratio_b1",
     "top1_agreement"}, "vs_llamacpp": {"ours_grounded_tok_s", "llamacpp_tok_s"},
     "tool_drafts": {...}, "int4": {...}, "verify_b8": {...} (``bench/verify_head.py``)},
     "details": {...}, "setup": {...}}
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.decode_timing import mean_tpot, run_batch, spec_figures, spec_off  # noqa: E402
from bench.result_file import command, load_average, utc_now, write_json  # noqa: E402
from bench.serving_client import EngineProcess, median, timed_stream  # noqa: E402

DATA = REPO.parent / "shared" / "data"
MODEL_DIR = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
GGUF = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = REPO / "bench" / "results" / "engine_speculative.json"
KNEE_FACTOR = 2.0
SYSTEM = "You are an airline customer service agent. Be precise: copy ids and values exactly."
OPEN_QUESTIONS = [
    "Write a short poem about the sea.", "Why is the sky blue? Explain simply.",
    "Give me three ideas for a birthday party.", "What makes a good cup of coffee?",
    "Tell me a short story about a robot who learns to paint.",
    "How do airplanes stay in the air?", "Describe your ideal weekend.",
    "What are the benefits of learning a second language?",
]


# -- prompts ---------------------------------------------------------------------------------
def _trace() -> list[dict[str, Any]]:
    return json.loads((DATA / "traces" / "tau_bench_airline_gpt4o.json").read_text())


def grounded_messages(n: int) -> list[list[dict[str, str]]]:
    """``n`` chats whose answer copies a tau-bench tool result (three kinds, interleaved)."""
    results: list[tuple[str, str]] = []  # (tool JSON, the customer's last request)
    seen: set[str] = set()
    for run in _trace():
        last_user = ""
        for m in run["traj"]:
            content = str(m.get("content") or "")
            if m["role"] == "user":
                last_user = content
            if m["role"] == "tool" and 200 <= len(content) <= 900 and content not in seen:
                seen.add(content)
                results.append((content, last_user))
    out = []
    for i, (tool, user) in enumerate(results[:n]):
        if i % 3 == 0:
            ask = f"Here is a tool result:\n{tool}\n\nRestate it exactly, as JSON."
        elif i % 3 == 1:
            ask = f"Tool result:\n{tool}\n\nList every id and value in it, quoting them exactly."
        else:
            ask = (f"Customer: {user[:300]}\n\nTool result:\n{tool}\n\n"
                   "Answer the customer with the details from the tool result.")
        out.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}])
    return out


def open_messages(n: int) -> list[list[dict[str, str]]]:
    """``n`` open-ended chats: general questions, then the trace's first customer turns."""
    firsts = [next(m["content"] for m in r["traj"] if m["role"] == "user") for r in _trace()]
    asks = OPEN_QUESTIONS + [f"{u} Please tell me what you would need from me." for u in firsts]
    return [[{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": a}] for a in asks[:n]]


def agreement_prompts(tok: Any, n: int, max_len: int = 700) -> list[list[int]]:
    """Conversation prefixes (system policy cut short) ending before an assistant turn."""
    from prefixgate.local_engine.server.chat import encode_chat

    out: list[list[int]] = []
    for run in _trace():
        msgs = [{"role": "system", "content": run["traj"][0]["content"][:600]}]
        for m in run["traj"][1:]:
            if m["role"] == "assistant" and len(msgs) > 1 and msgs[-1]["role"] != "assistant":
                out.append(encode_chat(tok, msgs)[-max_len:])
                if len(out) >= n:
                    return out
            content = str(m.get("content") or "")
            if m.get("tool_calls"):
                content = json.dumps([c["function"] for c in m["tool_calls"]])
            role = "user" if m["role"] == "tool" else m["role"]
            msgs.append({"role": role, "content": content[:600]})
    return out


# -- timing ----------------------------------------------------------------------------------
def compare(eng: Any, prompts: list[list[int]], params: Any, batch: int) -> dict[str, Any]:
    """Groups of ``batch`` prompts, each run speculative first then plain on the same engine
    (so the suffix index never holds a prompt's own plain output); mean TPOT (ms) of each, and
    ``identical``: every prompt's greedy output the same token ids both ways."""
    rows: dict[str, list[dict[str, Any]]] = {"spec": [], "plain": []}
    for g in range(0, len(prompts), batch):
        group = prompts[g:g + batch]
        rows["spec"] += run_batch(eng, group, params, keep_ids=True)
        with spec_off(eng):
            rows["plain"] += run_batch(eng, group, params, keep_ids=True)
    out: dict[str, Any] = {k: round(mean_tpot(v) * 1000, 2) for k, v in rows.items()}
    out["identical"] = all(a["ids"] == b["ids"] for a, b in zip(rows["spec"], rows["plain"]))
    return out


def knee(eng: Any, tok_ids: list[list[int]], sizes: list[int]) -> dict[str, Any]:
    """Decode step time (ms) vs rows per step (spec off); threshold = largest size within
    ``KNEE_FACTOR`` × the 1-row step."""
    from prefixgate.local_engine.sched.api_types import SamplingParams

    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    step_ms: dict[int, float] = {}
    for b in sizes:
        runs = []
        for _ in range(2):  # the faster of two: other load on the box only ever adds time
            t = eng._timing
            s0, n0 = t["decode_s"], t["decode_tokens"]
            eng.generate_batch([tok_ids[i % len(tok_ids)][: 40 + i] for i in range(b)], p)
            steps = (t["decode_tokens"] - n0) / b
            runs.append((t["decode_s"] - s0) / steps * 1000)
        step_ms[b] = round(min(runs), 2)
    base = step_ms[sizes[0]]
    within = [b for b in sizes if step_ms[b] <= KNEE_FACTOR * base]
    from prefixgate.local_engine.spec.decode import choose_k_cap

    curve = sorted(step_ms.items())
    caps = {f"b{b}_alpha{a}": choose_k_cap([a] * b, [8] * b, curve, 8)
            for b in (1, 8) for a in (0.9, 0.5, 0.2)}
    return {"step_ms": step_ms, "threshold_rows": max(within), "k_cap_chosen": caps}


def llamacpp_tok_s(messages: list[list[dict[str, str]]], threads: int, max_tokens: int,
                   log: Path, poll: int = 50) -> float | None:
    """llama.cpp plain decode tokens/s (median over ``messages``, batch 1), or None if absent.
    ``poll``: its threadpool busy-poll level (0-100; 50, llama.cpp's default, measured fastest
    on 2 shared cores by ``bench/engine_vs_llamacpp.py``)."""
    if not GGUF.exists():
        return None
    cmd = [sys.executable, str(REPO / "bench" / "llamacpp_server.py"), "--gguf", str(GGUF),
           "--threads", str(threads), "--poll", str(poll), "--port"]
    server = EngineProcess(GGUF, log_path=log, command=cmd)
    server.cmd.append(str(server.port))
    rates = []
    # a fresh connection per request: llama.cpp's server may drop a kept-alive one
    with server, httpx.Client(timeout=600,
                              limits=httpx.Limits(max_keepalive_connections=0)) as client:
        timed_stream(client, server.base_url, {"messages": [{"role": "user", "content": "hi"}],
                                               "max_tokens": 2})
        for msgs in messages:
            t = timed_stream(client, server.base_url, {"model": "m", "messages": msgs,
                                                       "max_tokens": max_tokens,
                                                       "temperature": 0})
            if t.decode_tokens_per_s:
                rates.append(t.decode_tokens_per_s)
    return round(median(rates) or 0.0, 2) if rates else None


def main() -> None:
    """Measure and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, <= 60 s")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--b1", type=int, default=4, help="prompts run one at a time")
    ap.add_argument("--b8", type=int, default=8, help="prompts run 8 at a time (0: skip)")
    ap.add_argument("--agree", type=int, default=60, help="prompts for int8 top-1 agreement")
    ap.add_argument("--k", type=int, default=6, help="most draft tokens per request and step")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--only", default="", help="comma list of sections to rerun (int8, tool_drafts, "
                    "int4); the others are kept from the existing JSON")
    ap.add_argument("--tool-b1", type=int, default=3, help="tool-call prompts run one at a time")
    ap.add_argument("--tool-b8", type=int, default=8, help="tool-call prompts run 8 at a time")
    ap.add_argument("--note", default="", help="recorded in setup (e.g. the box was shared)")
    ap.add_argument("--int4-from", default="", help="with --only int4: the int4 section from "
                    "this bench/int4_candidates.py JSON instead of the kernel probe")
    ap.add_argument("--skip", default="", help="comma list of sections main leaves as they were "
                    "(tool_drafts, int4): rerun them with --only")
    ap.add_argument("--llamacpp-poll", type=int, nargs="+", default=[50, 0],
                    help="llama.cpp busy-poll levels, each run; the figure is the fastest")
    args = ap.parse_args()
    if args.only:
        partial_main(args, set(args.only.split(",")))
        return
    import torch

    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.model.quant.sensitivity import first_token_agreement
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    torch.set_num_threads(args.threads)
    t0, load0 = time.time(), load_average()
    n_b1, n_b8, n_agree, sizes = args.b1, args.b8, args.agree, [1, 2, 4, 6, 8, 12, 16, 24, 32]
    if args.quick:
        args.max_tokens, n_b1, n_b8, n_agree, sizes = 20, 1, 0, 4, [1, 4, 8]
    base = dict(model_path=str(MODEL_DIR), device=args.device, num_kv_slots=32768,
                max_context_len=2048, speculative="ngram+suffix", num_speculative_tokens=args.k,
                spec_max_batch_tokens=max(sizes))
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    e32 = Engine(EngineConfig(**base))
    tok = e32.tokenizer
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    g_msgs = grounded_messages(n_b1 + n_b8)
    o_msgs = open_messages(n_b1 + n_b8)
    g_ids = [encode_chat(tok, m) for m in g_msgs]
    o_ids = [encode_chat(tok, m) for m in o_msgs]
    with spec_off(e32):
        e32.generate_batch([g_ids[0][:30]], warm)
        kn = knee(e32, g_ids + o_ids, sizes)
    e32.spec.cost_curve = sorted(kn["step_ms"].items())
    phases: dict[str, float] = {"load+knee": round(time.time() - t0, 1)}
    details: dict[str, Any] = {"knee": kn}
    figures: dict[str, Any] = {}
    for name, ids in (("grounded", g_ids), ("open", o_ids)):
        before = e32.stats()
        b1 = compare(e32, ids[:n_b1], greedy, 1)
        b8 = compare(e32, ids[n_b1:n_b1 + n_b8], greedy, 8) if n_b8 else None
        sf = spec_figures(e32, before)
        figures[name] = {
            "tpot_ratio_b1": round(b1["plain"] / b1["spec"], 3),
            "tpot_ratio_b8": round(b8["plain"] / b8["spec"], 3) if b8 else None,
            "identical_outputs": b1.pop("identical") and (b8.pop("identical") if b8 else True),
        }
        if name == "grounded":
            figures[name].update(acceptance_rate=sf["acceptance_rate"],
                                 mean_accepted_len=sf["mean_accepted_len"])
        details[name] = {"tpot_ms_b1": b1, "tpot_ms_b8": b8, **sf}
    phases["spec"] = round(time.time() - t0, 1)
    # int8: plain decode vs fp32 plain decode, top-1 agreement, then int8 + speculation
    q8 = Engine(EngineConfig(**base, quantization="int8"))
    dec_prompts = g_ids[:max(1, n_b1 // 2)] + o_ids[:max(1, n_b1 // 2)]
    fixed = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    with spec_off(e32), spec_off(q8):
        q8.generate_batch([g_ids[0][:30]], warm)
        kn8 = knee(q8, g_ids + o_ids, sizes)
        rows: dict[str, list[dict[str, float]]] = {"fp32": [], "int8": []}
        for i, ids in enumerate(dec_prompts):
            for name, eng in ((("fp32", e32), ("int8", q8)) if i % 2 == 0 else
                              (("int8", q8), ("fp32", e32))):
                rows[name] += run_batch(eng, [ids], fixed)
        dec = {k: round(mean_tpot(v) * 1000, 2) for k, v in rows.items()}
        agree_ids = agreement_prompts(tok, n_agree, 200 if args.quick else 500)
        one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        ref = [o[0] for o in e32.generate_batch(agree_ids, one)]
        got = [o[0] for o in q8.generate_batch(agree_ids, one)]
    e32.shutdown()
    figures["int8"] = {"decode_ratio_b1": round(dec["fp32"] / dec["int8"], 3),
                       "top1_agreement": first_token_agreement(ref, got)}
    details["int8"] = {"tpot_ms_b1": dec, "agreement_prompts": len(ref), "knee": kn8,
                       "disagreeing_prompts": [i for i, (a, b) in enumerate(zip(ref, got)) if a != b],
                       "kept_fp32": {k: getattr(q8.cfg, k) for k in (
                           "quant_fp32_layers", "quant_fp32_head", "quant_outlier_channels")}}
    phases["int8"] = round(time.time() - t0, 1)
    q8.spec.cost_curve = sorted(kn8["step_ms"].items())
    spec_rows = []
    for ids in g_ids[:n_b1]:
        spec_rows += run_batch(q8, [ids], greedy)
    ours = round(1.0 / mean_tpot(spec_rows), 2)
    q8.shutdown()
    phases["int8_spec"] = round(time.time() - t0, 1)
    runs: dict[str, float | None] = {}
    for poll in ([] if args.no_llamacpp else args.llamacpp_poll):
        try:
            runs[f"poll{poll}"] = llamacpp_tok_s(g_msgs[:n_b1], args.threads, args.max_tokens, Path(
                tempfile.gettempdir()) / "engine_speculative_llamacpp.log", poll=poll)
        except (RuntimeError, httpx.HTTPError) as exc:
            details[f"llamacpp_poll{poll}_error"] = str(exc)
    phases["llamacpp"] = round(time.time() - t0, 1)
    llama = max((v for v in runs.values() if v), default=None)
    figures["vs_llamacpp"] = {"ours_grounded_tok_s": ours, "llamacpp_tok_s": llama,
                              "llamacpp_best": max(runs, key=lambda k: runs[k] or 0) if llama else None}
    details["llamacpp_tok_s_by_poll"] = runs
    from bench.decode_sections import int4_probe, tool_drafts

    skip = set(args.skip.split(",")) - {""}
    if "tool_drafts" not in skip:
        figures["tool_drafts"], details["tool_drafts"] = tool_drafts(
            base, args.tool_b1, args.tool_b8, args.max_tokens, sorted(kn["step_ms"].items()))
    if "int4" not in skip:
        probe = int4_probe()
        figures["int4"] = int4_figures(probe)
        details["int4"] = probe
    phases["tool_drafts+int4"] = round(time.time() - t0, 1)
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    kept = sorted(set(old.get("figures", {})) - set(figures))  # sections this run did not redo
    figures.update({k: old["figures"][k] for k in kept})
    details.update({k: v for k, v in old.get("details", {}).items()
                    if k not in details and k.split("_all_runs")[0].split("_pooled")[0] in kept})
    result = {
        "command": command(__file__, prefix=".venv/bin/python"),
        "figures": figures,
        "goals": goals(figures),
        "details": details,
        "setup": {
            "model": "SmolLM2-135M-Instruct (fp32 safetensors; llama.cpp: Q4_1 GGUF)",
            "device": args.device, "threads": args.threads, "max_tokens": args.max_tokens,
            "prompts": {"b1": n_b1, "b8": n_b8, "agreement": n_agree},
            "speculative": {k: base[k] for k in ("speculative", "num_speculative_tokens",
                                                 "spec_max_batch_tokens")},
            "spec_cost_curve": "the knee's step_ms of the same engine (fp32 / int8)",
            "knee_factor": KNEE_FACTOR,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "note": "ours timed in-process from streamed engine outputs; llama.cpp over its "
                    "HTTP streaming API; greedy, EOS on; fp32 engines (plain and speculative) "
                    "use oneDNN pre-packed linear weights (prefixgate/local_engine/model/quant/cpu_linear.py)",
            "wall_s": round(time.time() - t0, 1),
            "phases_s_since_start": phases,
            "loadavg_at_start_and_end": [load0, load_average()],
            "sections_kept_from_earlier_runs": kept,
            "earlier_runs": [r for r in old.get("setup", {}).get("partial_runs", [])
                             if set(r.get("sections", [])) & set(kept)],
            "user_note": args.note,
        },
    }
    write_json(args.out, result)
    print(json.dumps(result["figures"], indent=2))


def int8_figures(base: dict[str, Any], n_agree: int, n_dec: int, max_tokens: int,
                 **quant: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """int8 (default keep policy) vs fp32 at batch 1: decode TPOT ratio on ``n_dec`` prompts
    (alternating order) and first-token greedy agreement on ``n_agree`` prompts."""
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.model.quant.sensitivity import first_token_agreement
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    plain = {**base, "speculative": None}
    e32, q8 = Engine(EngineConfig(**plain)), Engine(EngineConfig(**plain, quantization="int8", **quant))
    tok = e32.tokenizer
    dec_prompts = [encode_chat(tok, m) for m in grounded_messages(n_dec)]
    fixed = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rows: dict[str, list[dict[str, Any]]] = {"fp32": [], "int8": [], "fp32_full_head": []}
    screened = e32.model._argmax_head
    for i, ids in enumerate(dec_prompts):
        order = [("fp32", e32), ("int8", q8), ("fp32_full_head", e32)]
        for name, eng in order[i % 3:] + order[:i % 3]:
            e32.model._argmax_head = None if name == "fp32_full_head" else screened
            rows[name] += run_batch(eng, [ids], fixed)
    e32.model._argmax_head = screened
    dec = {k: round(mean_tpot(v) * 1000, 2) for k, v in rows.items()}
    agree_ids = agreement_prompts(tok, n_agree, 500)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ref = [o[0] for o in e32.generate_batch(agree_ids, one)]
    got = [o[0] for o in q8.generate_batch(agree_ids, one)]
    e32.shutdown()
    q8.shutdown()
    fig = {"decode_ratio_b1": round(dec["fp32"] / dec["int8"], 3),
           "decode_ratio_b1_vs_fp32_full_head": round(dec["fp32_full_head"] / dec["int8"], 3),
           "top1_agreement": first_token_agreement(ref, got)}
    det = {"tpot_ms_b1": dec, "agreement_prompts": len(ref),
           "disagreeing_prompts": [i for i, (a, b) in enumerate(zip(ref, got)) if a != b],
           "kept_fp32": {k: getattr(q8.cfg, k) for k in (
               "quant_fp32_layers", "quant_fp32_head", "quant_outlier_channels")},
           "fp32_engines": "fp32 = packed fp32 with the screened head (the default engine); "
                           "fp32_full_head = the same engine with model._argmax_head detached"}
    return fig, det


def int4_figures(probe: dict[str, Any]) -> dict[str, Any]:
    """The int4 section's figures from ``decode_sections.int4_probe`` (speed ratios per row)."""
    us = probe["us_per_row"]
    return {"kernel": "torch _weight_int4pack_mm_for_cpu", "adopted": False,
            "int4_vs_fp32_matmul": round(us["fp32_onednn"] / us["int4_torch"], 3),
            "int4_bf16_act_vs_int8_matmul": round(us["int8"] / us["int4_torch_bf16_act"], 3),
            "int4_bf16_act_max_rel_err": round(probe["int4_bf16_act_max_rel_err"], 5)}


def goals(figures: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's goals (issue 27 adds tool_drafts / int4) as booleans; None when unmeasured."""
    def at(path: str) -> Any:
        node: Any = figures
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def ge(path: str, bound: float) -> bool | None:
        v = at(path)
        return None if v is None else bool(v >= bound)

    out = {f"{p}>={b}": ge(p, b) for p, b in (
        ("grounded.tpot_ratio_b1", 2.0), ("grounded.tpot_ratio_b8", 1.3), ("open.tpot_ratio_b1", 0.97),
        ("open.tpot_ratio_b8", 0.97), ("int8.decode_ratio_b1", 1.7), ("int8.top1_agreement", 0.98),
        ("tool_drafts.mean_accepted_len_b1", 3.0), ("tool_drafts.tpot_ratio_b1", 2.5),
        ("tool_drafts.tpot_ratio_b8", 1.3), ("verify_b8.tool_tpot_ratio_b8_screened", 1.3),
        ("verify_b8.open_tpot_ratio_b8_screened", 0.97))}
    ours, llama = at("vs_llamacpp.ours_grounded_tok_s"), at("vs_llamacpp.llamacpp_tok_s")
    out["vs_llamacpp ours>llamacpp"] = None if ours is None or llama is None else bool(ours > llama)
    for sec in ("grounded", "open", "tool_drafts", "verify_b8"):
        out[f"{sec}.identical_outputs"] = at(f"{sec}.identical_outputs")
    i4, l4 = at("int4.best_int4_tok_s_b1"), at("int4.llamacpp_q4_1_tok_s")
    out["int4 decode>=llamacpp Q4_1"] = None if i4 is None or l4 is None else bool(i4 >= l4)
    return out


def partial_main(args: Any, want: set[str]) -> None:
    """Rerun only the sections in ``want``; the rest of the existing JSON is kept as it was."""
    import torch

    from bench.decode_sections import int4_probe, tool_drafts

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {"figures": {}, "details": {}, "setup": {}}
    figures, details = result["figures"], result["details"]
    t0 = time.time()
    base = dict(model_path=str(MODEL_DIR), device=args.device, num_kv_slots=16384, max_context_len=2048,
                speculative="ngram+suffix", num_speculative_tokens=args.k, spec_max_batch_tokens=32)
    if "int8" in want:
        figures["int8"], new = int8_figures(base, args.agree, args.b1, args.max_tokens)
        details["int8"] = {**details.get("int8", {}), **new}
    if "int8_variants" in want:  # the same figures for other keep policies
        details["int8_variants"] = [{"quant": q, **dict(zip(("figures", "details"), int8_figures(
            base, args.agree, args.b1, args.max_tokens, **q)))} for q in (
            {"quant_fp32_layers": 0},)]  # no layer kept: what keeping 6 costs
    if "tool_drafts" in want:
        # the engine's default head is the screened one: its measured curve when recorded
        curve = details.get("verify_b8", {}).get("knee", {}).get("screened") or details.get(
            "knee", {}).get("step_ms")
        figures["tool_drafts"], details["tool_drafts"] = tool_drafts(
            base, args.tool_b1, args.tool_b8, args.max_tokens,
            sorted((int(k), v) for k, v in curve.items()) if curve else None)
    if "int4" in want and args.int4_from:  # bench/int4_candidates.py's JSON, run beforehand
        from bench.decode_sections import int4_summary

        figures["int4"], details["int4"] = int4_summary(json.loads(Path(args.int4_from).read_text()))
    elif "int4" in want:
        probe = int4_probe()
        figures["int4"] = int4_figures(probe)
        details["int4"] = probe
    result["goals"] = goals(figures)
    runs = result["setup"].setdefault("partial_runs", [])
    runs.append({"command": command(__file__, prefix=".venv/bin/python"),
                 "sections": sorted(want), "wall_s": round(time.time() - t0, 1),
                 "at": utc_now(), "note": args.note,
                 "max_tokens": args.max_tokens})
    write_json(out, result)
    print(json.dumps({k: figures[k] for k in want if k in figures}, indent=2))


if __name__ == "__main__":
    main()
