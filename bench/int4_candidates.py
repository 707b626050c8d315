"""4-bit CPU kernels from PyPI against our int8 and llama.cpp Q4_1 at batch 1 (issue 27).

    .venv/bin/python bench/int4_candidates.py [--ark PATH] [--prompts 4] [--max-tokens 96]
        [--agree 30] [--llamacpp-poll 50 0]

Candidates (PyPI, usable from torch 2.13 CPU; looked at 2026-12-06):

- torch's own ``_weight_int4pack_mm_for_cpu`` (what torchao 0.18's CPU int4 layout calls; group
  32, asymmetric), bf16 activations (its vectorised path).
- ``auto-round-lib`` 0.16.0 (Intel's AutoRound Kernel, "ARK": BesTLA weight-only GEMM, requires
  torch >= 2.13): int4 group 32 asymmetric, compute int8 / fp32 / bf16. Not a dependency of the
  project: ``--ark`` points at a directory it was installed into
  (``pip install --no-deps --target DIR auto-round-lib py-cpuinfo``).
- Not usable here, recorded: torchao 0.18.0's PyPI wheel ships CUDA objects only (its x86
  ``da8w4_linear_cpu`` op has no CPU kernel registered: NotImplementedError);
  intel-extension-for-pytorch's last release (2.8.0) is built for torch 2.8.

Measured in one process, interleaved: µs per one-row product on SmolLM2-135M's four shapes;
whole-model decode TPOT at batch 1 (plain, greedy, ``ignore_eos``) of the engine with each
candidate's int4 products in every decoder layer (LM head as in int8 mode: fp32 with the
screened argmax), against the fp32 engine and the int8 engine (default keep policy); first-token
greedy agreement with fp32 on ``--agree`` benchmark prompts; then llama.cpp's plain decode of
the Q4_1 GGUF on the same prompts (``bench/llamacpp_server.py``, 2 threads, each
``--llamacpp-poll``). Prints a JSON object (the int4 section of
``bench/results/engine_speculative.json`` is written from it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, load_average, utc_now, write_json  # noqa: E402

GROUP = 32
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def _q4(w: Any) -> tuple[Any, Any, Any]:
    """Group-32 asymmetric 4-bit of ``w [N, K]``: ``(q [N, K] in 0..15, scale [N, K/32],
    minimum [N, K/32])`` with ``w ≈ q * scale + minimum`` (llama.cpp's Q4_1 rule)."""
    import torch

    n, k = w.shape
    wg = w.float().view(n, k // GROUP, GROUP)
    mn = wg.amin(-1)
    sc = ((wg.amax(-1) - mn) / 15).clamp_min(1e-9)
    q = torch.round((wg - mn[..., None]) / sc[..., None]).clamp(0, 15)
    return q.view(n, k), sc, mn


class TorchInt4:
    """torch ``_weight_int4pack_mm_for_cpu`` product, bf16 activations; ``(x [T, K]) -> [T, N]``
    fp32."""

    def __init__(self, w: Any, b: Any) -> None:
        import torch

        q, sc, mn = _q4(w)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        self.sz = torch.stack([sc, mn + 8 * sc], -1).transpose(0, 1).contiguous().bfloat16()
        self.b = b

    def __call__(self, x: Any) -> Any:
        import torch

        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), self.packed, GROUP, self.sz).float()
        return y if self.b is None else y + self.b


class ArkInt4:
    """auto-round-lib (ARK) ``woqgemm`` int4 product, zero point per group (integer, so the
    Q4_1 minimum is rounded to a multiple of the scale); ``(x [T, K]) -> [T, N]`` fp32."""

    def __init__(self, ark: Any, w: Any, b: Any, compute: str) -> None:
        import torch

        n, k = w.shape
        wg = w.float().view(n, k // GROUP, GROUP)
        mn, mx = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        s = ((mx - mn) / 15).clamp_min(1e-9)
        zp = torch.round(-mn / s) - 8  # w = s * (q - zp), q in -8..7
        q = torch.clamp(torch.round(wg / s) + zp, -8, 7)
        self.blob = ark.repack_quantized_weight(
            q.view(n, k).t().contiguous().to(torch.int8), s.view(n, -1).t().contiguous(),
            zp.view(n, -1).t().contiguous().to(torch.int8), GROUP, compute, "int4", "fp32", True)
        self.ark, self.n, self.k, self.compute = ark, n, k, compute
        self.bias = torch.zeros(1, n) if b is None else b.float().view(1, n).contiguous()

    def __call__(self, x: Any) -> Any:
        return self.ark.woqgemm(x.float().contiguous(), self.blob, self.bias, self.n, self.k, GROUP,
                                self.compute, "int4", "fp32", True)


def _us(fn: Any, x: Any, n: int = 200) -> float:
    for _ in range(20):
        fn(x)
    t = time.perf_counter()
    for _ in range(n):
        fn(x)
    return (time.perf_counter() - t) / n * 1e6


def product_us(makers: dict[str, Any], rounds: int = 3) -> dict[str, dict[str, float]]:
    """Best-of-``rounds`` µs per one-row product for each maker on each of ``SHAPES``."""
    import torch

    torch.manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for kind, (n, k) in SHAPES.items():
        w, x = torch.randn(n, k) * 0.02, torch.randn(1, k)
        built = {name: mk(w, None) for name, mk in makers.items()}
        best: dict[str, float] = {}
        for _ in range(rounds):
            for name, f in built.items():
                best[name] = min(best.get(name, float("inf")), _us(f, x))
        out[kind] = {name: round(v, 1) for name, v in best.items()}
    return out


def int4_engine(base: dict[str, Any], make: Any) -> Any:
    """An fp32 engine (packed, screened head) whose decoder products are ``make(w, b)``."""
    import torch

    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.model.llama import load_model
    from prefixgate.local_engine.model.quant.int8 import linear_any

    eng = Engine(EngineConfig(**base))
    src = load_model(base["model_path"], torch.device("cpu"), torch.float32)
    for layer, s in zip(eng.model.decoder_layers(), src.decoder_layers()):
        w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down = s._w
        layer._w = (layer._w[0], make(w_qkv, b_qkv), None, make(w_o, None),  # type: ignore[assignment]
                    layer._w[4], make(w_gu, None), make(w_down, None))
        layer._mm = linear_any
    return eng


def main() -> None:
    """Measure and print the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ark", default="", help="directory auto-round-lib was installed into")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--agree", type=int, default=30)
    ap.add_argument("--llamacpp-poll", type=int, nargs="+", default=[50, 0])
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args()
    import torch

    from bench.decode_timing import mean_tpot, run_batch
    from bench.engine_speculative import MODEL_DIR, agreement_prompts, grounded_messages, llamacpp_tok_s
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.model.quant.cpu_linear import PackedLinear
    from prefixgate.local_engine.model.quant.int8 import Int8Linear
    from prefixgate.local_engine.model.quant.sensitivity import first_token_agreement
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    torch.set_num_threads(args.threads)
    t0 = time.time()
    makers: dict[str, Any] = {"fp32_onednn": PackedLinear, "int8_ours": Int8Linear,
                              "int4_torch_bf16_act": TorchInt4}
    notes: dict[str, str] = {}
    if args.ark:
        sys.path.insert(0, args.ark)
        import auto_round_kernel as ark

        for ct in ("int8", "fp32", "bf16"):
            makers[f"int4_ark_{ct}"] = lambda w, b, ct=ct: ArkInt4(ark, w, b, ct)
    products = product_us(makers)
    cands = [m for m in makers if m.startswith("int4")]
    best_ark = min((m for m in cands if m.startswith("int4_ark")),
                   key=lambda m: sum(products[k][m] for k in SHAPES), default=None)
    engines_int4 = ["int4_torch_bf16_act"] + ([best_ark] if best_ark else [])
    base = dict(model_path=str(MODEL_DIR), device="cpu", num_kv_slots=16384, max_context_len=2048)
    engines = {"fp32": Engine(EngineConfig(**base)),
               "int8": Engine(EngineConfig(**base, quantization="int8"))}
    for name in engines_int4:
        engines[name] = int4_engine(base, makers[name])
    tok = engines["fp32"].tokenizer
    msgs = grounded_messages(args.prompts)
    prompts = [encode_chat(tok, m) for m in msgs]
    fixed = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    names = list(engines)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for eng in engines.values():
        run_batch(eng, [prompts[0][:30]], SamplingParams(max_tokens=4, temperature=0.0))
    for i, ids in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            rows[name] += run_batch(engines[name], [ids], fixed)
    tpot = {n: round(mean_tpot(v) * 1000, 2) for n, v in rows.items()}
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    agree_ids = agreement_prompts(tok, args.agree, 500)
    ref = [o[0] for o in engines["fp32"].generate_batch(agree_ids, one)]
    agree = {n: first_token_agreement(ref, [o[0] for o in engines[n].generate_batch(agree_ids, one)])
             for n in names if n != "fp32"}
    for eng in engines.values():
        eng.shutdown()
    llama: dict[str, float | None] = {}
    for poll in args.llamacpp_poll:
        llama[f"poll{poll}"] = llamacpp_tok_s(msgs, args.threads, args.max_tokens,
                                              Path(tempfile.gettempdir()) / "int4_candidates_llamacpp.log",
                                              poll=poll)
    best_llama = max((v for v in llama.values() if v), default=None)
    tok_s = {n: round(1000 / v, 2) for n, v in tpot.items()}
    best_int4 = max(engines_int4, key=lambda n: tok_s[n])
    result = {
        "command": command(__file__, prefix=".venv/bin/python"),
        "us_per_row": products, "decode_tpot_ms_b1": tpot, "decode_tok_s_b1": tok_s,
        "first_token_agreement_vs_fp32": agree, "llamacpp_q4_1_tok_s": llama,
        "best_int4": best_int4,
        "best_int4_tok_s_over_llamacpp": round(tok_s[best_int4] / best_llama, 3) if best_llama else None,
        "setup": {"threads": args.threads, "prompts": args.prompts, "max_tokens": args.max_tokens,
                  "agreement_prompts": len(agree_ids), "group": GROUP, "notes": notes,
                  "uptime_before": load_average(), "wall_s": round(time.time() - t0, 1),
                  "at": utc_now()},
    }
    if args.out:
        write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
