"""Run the `llm-comply` suites (openai-chat, anthropic, open-responses) against the proxy in
front of our local engine, and sort every failure into *schema / protocol* or *capability*.

    python -m bench.conformance --model ~/.cache/prefixgate/models/SmolLM2-135M-Instruct \
        --out bench/results/conformance.json

writes ``{"command", "figures": {suite: {"passed", "failed", "schema_failures",
"capability_failures": [{"id", "why"}], "schema_failure_ids"}}}``.

A failure is a *capability* failure when every one of its errors is something the 135M text
model cannot do (see :data:`CAPABILITY`: it does not call the tool it was asked to call, it has
no vision or reasoning); anything else — a JSON-schema error, a missing event, a wrong status —
is a schema / protocol failure, which ``tests/proxy/test_conformance.py`` fails the build on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.result_file import command, write_json

SUITES = ("openai-chat", "anthropic", "open-responses")

# Failures the 135M model (or the tiny random one CI uses) causes by what it cannot do, by test
# id: the error texts that prove it. A failure is a capability failure only when its errors are
# all of these; any other error (a JSON-schema error, a missing event, a wrong status) is a
# schema / protocol failure.
_UNFINISHED = ("finish_reason: expected 'stop', got 'length'",
               "stop_reason: expected 'end_turn', got 'max_tokens'",
               "expected status='completed', got 'incomplete'")  # no EOS within the cap
_NO_TOOL_CALL = ("tool_calls is missing", "finish_reason: expected 'tool_calls'",
                 "no content block with type='tool_use'", "stop_reason: expected 'tool_use'",
                 "no output item with type='function_call'")
CAPABILITY: dict[str, tuple[str, ...]] = {
    "chat-basic-response": _UNFINISHED, "chat-system-prompt": _UNFINISHED,
    "chat-multi-turn": _UNFINISHED, "anth-basic-response": _UNFINISHED,
    "anth-system-prompt": _UNFINISHED, "anth-multi-turn": _UNFINISHED,
    "basic-response": _UNFINISHED, "system-prompt": _UNFINISHED, "multi-turn": _UNFINISHED,
    "streaming-response": _UNFINISHED, "assistant-phase": _UNFINISHED,
    "response-output-phase-schema": _UNFINISHED,
    # the model answers in text instead of calling the tool it was asked to call
    "chat-tool-calling": _NO_TOOL_CALL + _UNFINISHED,
    "anth-tool-calling": _NO_TOOL_CALL + _UNFINISHED,
    "tool-calling": _NO_TOOL_CALL,
}
# A text-only model: an image is refused with a 400 naming the part (never dropped silently);
# the other errors of such a test only restate that the answer is an error body.
IMAGE_TESTS = ("chat-image-input", "anth-image-input", "image-input")


def classify(result: dict[str, Any]) -> str:
    """``"passed"``, ``"capability"`` or ``"schema"`` for one llm-comply result dict (skipped
    tests count as passed: they ask for a model family, e.g. reasoning)."""
    if result["status"] != "failed":
        return "passed"
    errors = result.get("errors") or []
    if result["id"] in IMAGE_TESTS and errors and errors[0].startswith("HTTP 400 "):
        return "capability"
    marks = CAPABILITY.get(result["id"])
    if marks and errors and all(any(m in e for m in marks) for e in errors):
        return "capability"
    return "schema"


def run_suite(base_url: str, model: str, suite: str, timeout_s: float = 120.0
              ) -> list[dict[str, Any]]:
    """Run one llm-comply suite (its own CLI, ``--json``); return its result dicts (``id``,
    ``status``, ``errors``). Anthropic is asked with ``x-api-key`` (no ``Bearer``)."""
    exe = Path(sys.executable).with_name("llm-comply")
    cmd = [str(exe), "--format", suite, "--json", "--timeout", str(timeout_s),
           "-u", base_url + "/v1", "-m", model, "-k", "sk-conformance"]
    if suite == "anthropic":
        cmd += ["--auth-header", "x-api-key", "--no-bearer"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30 * timeout_s)
    try:
        return list(json.loads(proc.stdout)["results"])
    except (ValueError, KeyError) as e:
        raise RuntimeError(f"llm-comply gave no JSON (rc {proc.returncode}): "
                           f"{proc.stderr[-2000:]}") from e


def figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One suite's figures: passed, failed, schema_failures, capability failures listed."""
    kinds = [(r, classify(r)) for r in results]
    return {
        "passed": sum(r["status"] == "passed" for r in results),
        "failed": sum(r["status"] == "failed" for r in results),
        "skipped": sum(r["status"] == "skipped" for r in results),
        "schema_failures": sum(k == "schema" for _, k in kinds),
        "schema_failure_ids": [r["id"] for r, k in kinds if k == "schema"],
        "capability_failures": [{"id": r["id"], "why": (r.get("errors") or [""])[0][:200]}
                                for r, k in kinds if k == "capability"],
    }


@contextlib.contextmanager
def proxy_in_front_of_engine(model_dir: Path, name: str, max_context: int = 2048,
                             **extra: Any) -> Iterator[str]:
    """Our engine on ``model_dir`` (served as ``name``) behind the proxy (default rewriting);
    yields the proxy's base URL (no ``/v1``). ``extra``: more policy keys."""
    from prefixgate.config.loader import parse_policy
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app
    from prefixgate.proxy.app import build_app
    from tests.servers import serve_app

    eng = Engine(EngineConfig(model_path=str(model_dir), num_kv_slots=16384,
                              max_context_len=max_context, model_name=name))
    try:
        with serve_app(engine_app(eng)) as engine_url, tempfile.TemporaryDirectory() as tmp:
            policy = parse_policy({
                "backends": {"local": {"kind": "openai_compat", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "ledger": {"path": str(Path(tmp) / "ledger.sqlite")}, **extra})
            with serve_app(build_app(policy)) as url:
                yield url
    finally:
        eng.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="engine model directory")
    ap.add_argument("--name", default="smollm2", help="model name served")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--out", type=Path, default=None, help="write the figures JSON here")
    ap.add_argument("--default-max-tokens", type=int, default=256,
                    help="the policy's output cap for requests that name none (llm-comply's "
                         "name none; a 135M model may ramble to the cap on CPU)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"command": command("-m bench.conformance", argv), "figures": {}, "errors": {}}
    with proxy_in_front_of_engine(args.model.expanduser(), args.name,
                                  default_max_tokens=args.default_max_tokens) as url:
        for suite in args.suites.split(","):
            results = run_suite(url, args.name, suite, args.timeout)
            out["figures"][suite] = figures(results)
            out["errors"][suite] = {r["id"]: r.get("errors", []) for r in results
                                    if r["status"] == "failed"}
    print(json.dumps(out, indent=2))
    if args.out:
        write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
