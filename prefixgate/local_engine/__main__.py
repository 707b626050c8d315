"""``python -m prefixgate.local_engine --model DIR [--host 127.0.0.1] [--port 8081] [--device cpu] ...``

Loads the model into an ``Engine`` and serves its OpenAI-compatible API (``server/app.py``) with
uvicorn. Flags mirror ``EngineConfig``; ``--num-kv-slots`` / ``--kv-memory-gb`` size the KV
pool (tokens / GiB), ``--max-num-batched-tokens`` and ``--chunk-size`` bound each step's
prefill work (chunked prefill), ``--disable-prefix-cache`` turns the radix cache off.
``--speculative ngram+suffix`` (or ``draft`` with ``--draft-model``) turns speculative decoding
on; ``--quantization int8`` stores the linear weights as int8 with per-channel scales.
``--kv-events-endpoint tcp://*:5557`` (off by default) publishes KV events in vLLM's schema,
``--kv-events-replay tcp://*:5558`` serves their replay (``kv/publisher.py``).

P/D disaggregation (``--role``): ``both`` (default) prefills and decodes here. A ``prefill``
instance (``--pd-peer-url`` = the decode instance's base URL, for its cache match) and a
``decode`` instance pair over ``--pd-link tcp://HOST:PORT`` (``torch.distributed``, rank 0 =
prefill hosts it; gloo on CPU, NCCL on CUDA), set up once at start with a
``--pd-buffer-tokens`` staging buffer; ``--pd-timeout-s`` bounds pairing, each transfer and how
long an import waits for its decode request (``pd/roles.py``, ``server/pd_handoff.py``). Both
instances must hold one shared secret (``--pd-secret-file`` or ``$PREFIXGATE_PD_SECRET``, at least
16 bytes): the link is authenticated with it before any token or KV crosses, and the prefill
answer's ``kv_transfer_params`` are signed with it (``pd/auth.py``). The ``--pd-link`` port and the
engines' HTTP ports must not be reachable by clients: only the proxy and the peer instance.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m prefixgate.local_engine",
        description="Serve a model with the prefixgate engine over an OpenAI-compatible API.")
    p.add_argument("--model", required=True, help="HF model directory (safetensors + tokenizer)")
    p.add_argument("--model-name", default=None, help="name served in /v1/models and answers")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0, mps")
    p.add_argument("--dtype", default=None, help="weights dtype: float32, bfloat16, float16")
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: weights dtype)")
    p.add_argument("--num-kv-slots", type=int, default=None, help="KV pool size in tokens")
    p.add_argument("--kv-memory-gb", type=float, default=None, help="KV pool size in GiB")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--max-context-len", type=int, default=None,
                   help="cap on prompt + completion tokens (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--disable-prefix-cache", action="store_true")
    p.add_argument("--span-reuse", default="on", choices=["on", "off"],
                   help="reuse cached K/V across short changed spans (a clock, an id)")
    p.add_argument("--span-reuse-max-spans", type=int, default=4, help="most changed spans")
    p.add_argument("--span-reuse-max-span-tokens", type=int, default=48,
                   help="most tokens of one changed span (each side)")
    p.add_argument("--span-reuse-min-anchor-tokens", type=int, default=16,
                   help="shortest reused run between spans")
    p.add_argument("--span-reuse-values-only", default="on", choices=["on", "off"],
                   help="reuse only across changed digits / hex / separators (clocks, ids)")
    p.add_argument("--speculative", default=None,
                   help="speculative decoding drafters joined by '+': ngram, suffix, tools, draft")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="most draft tokens (k)")
    p.add_argument("--spec-max-batch-tokens", type=int, default=16,
                   help="no drafts when a step's decode rows + drafts would exceed this")
    p.add_argument("--spec-suffix-max-mb", type=float, default=64.0,
                   help="--speculative suffix: MiB its index may hold (least recently used go)")
    p.add_argument("--spec-suffix-max-namespaces", type=int, default=256,
                   help="--speculative suffix: cache_salt namespaces its index may hold")
    p.add_argument("--draft-model", default=None, help="draft model dir (--speculative draft)")
    p.add_argument("--no-packed-linear", action="store_true",
                   help="fp32 CPU: use plain F.linear instead of oneDNN pre-packed weights")
    p.add_argument("--quantization", default=None, choices=["int8"],
                   help="weight quantization (default: none, weights in --dtype)")
    p.add_argument("--kv-events-endpoint", default=None,
                   help="ZMQ PUB endpoint for KV events in vLLM's schema (default: off)")
    p.add_argument("--kv-events-replay", default=None, help="ZMQ endpoint of the replay socket")
    p.add_argument("--kv-events-block-size", type=int, default=16, help="tokens per event block")
    p.add_argument("--kv-events-hash", default="sha256", choices=["sha256", "sha256_cbor"])
    p.add_argument("--kv-events-seed", default="", help="block hash seed (sha256_cbor: vLLM's "
                   "PYTHONHASHSEED, else 'vllm-none-hash')")
    p.add_argument("--role", default="both", choices=["both", "prefill", "decode"],
                   help="P/D disaggregation role (both: colocated)")
    p.add_argument("--pd-link", default="tcp://127.0.0.1:29517",
                   help="torch.distributed init method both P/D instances share")
    p.add_argument("--pd-peer-url", default=None,
                   help="prefill role: the decode instance's base URL (asked for its cache match)")
    p.add_argument("--pd-buffer-tokens", type=int, default=4096,
                   help="most tokens one KV transfer carries (staging buffer, allocated once)")
    p.add_argument("--pd-backend", default=None, choices=["nccl", "gloo"],
                   help="P/D link backend (default: nccl on CUDA, gloo on CPU; gloo on CUDA stages "
                        "through host memory: two instances on one GPU)")
    p.add_argument("--pd-secret-file", default=None,
                   help="file holding the P/D pair's shared secret (default: $PREFIXGATE_PD_SECRET)")
    p.add_argument("--pd-timeout-s", type=float, default=30.0,
                   help="P/D pairing / transfer / unclaimed-import timeout (s)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between engine status log lines while busy (0: off)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Build the engine from the flags and serve it until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    secret = None
    if args.role != "both":  # checked before the model loads: a P/D role needs the pair's secret
        from prefixgate.local_engine.pd.auth import load_secret

        try:
            secret = load_secret(args.pd_secret_file)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--role {args.role}: {exc}") from None
    import uvicorn

    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app

    cfg = EngineConfig(
        model_path=args.model,
        device=args.device,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        num_kv_slots=args.num_kv_slots,
        kv_memory_gb=args.kv_memory_gb,
        page_size=args.page_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        chunk_size=args.chunk_size,
        max_running=args.max_running,
        enable_prefix_cache=not args.disable_prefix_cache,
        span_reuse=args.span_reuse == "on",
        span_reuse_max_spans=args.span_reuse_max_spans,
        span_reuse_max_span_tokens=args.span_reuse_max_span_tokens,
        span_reuse_min_anchor_tokens=args.span_reuse_min_anchor_tokens,
        span_reuse_values_only=args.span_reuse_values_only == "on",
        model_name=args.model_name,
        max_context_len=args.max_context_len,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        spec_max_batch_tokens=args.spec_max_batch_tokens,
        spec_suffix_max_bytes=int(args.spec_suffix_max_mb * (1 << 20)),
        spec_suffix_max_namespaces=args.spec_suffix_max_namespaces,
        draft_model_path=args.draft_model,
        quantization=args.quantization,
        packed_linear=not args.no_packed_linear,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay=args.kv_events_replay,
        kv_events_block_size=args.kv_events_block_size,
        kv_events_hash=args.kv_events_hash,
        kv_events_seed=args.kv_events_seed or ("vllm-none-hash" if args.kv_events_hash ==
                                                "sha256_cbor" else ""),
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = Engine(cfg)
    from prefixgate.local_engine.server.pd_setup import start_role

    pd, stop_pd = start_role(engine, args.role, args.pd_link, args.pd_peer_url,
                             args.pd_buffer_tokens, args.pd_timeout_s, args.host, args.port,
                             args.pd_backend, secret=secret)
    try:
        app = build_app(engine, log_stats_interval_s=args.log_stats_interval or None, pd=pd)
        # log_config=None: uvicorn's lines take the format above (one format, issue 37)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    log_config=None)
    finally:
        stop_pd()
        engine.shutdown()


if __name__ == "__main__":
    main()
