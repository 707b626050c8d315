"""P/D disaggregation, pure part: split or colocate, and each contract's request shapes.

``decide`` is the per-request decision (``config/pd_settings.py`` has the thresholds and where
their defaults come from). The body builders follow each project's own proxy:

- **vLLM** (``examples/online_serving/disaggregated_serving``): the prefill request is the
  client's body with ``max_tokens: 1`` (and ``max_completion_tokens``), ``stream: false``, no
  ``stream_options`` / ``min_tokens``, and ``kv_transfer_params: {"do_remote_decode": true,
  "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null,
  "remote_host": null, "remote_port": null}``; the decode request is the client's body with the
  prefill answer's ``kv_transfer_params`` verbatim.
- **SGLang** (``sgl-router`` PD mode): the client's body with ``bootstrap_host`` (the prefill
  host), ``bootstrap_port`` and ``bootstrap_room`` (a random 63-bit int), sent to both at once.
- **llm-d** (routing sidecar): the client's body to the decode pod, the prefill pod in an
  ``x-prefiller-host-port: host:port`` header.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prefixgate.config.pd_settings import PDSettings

__all__ = ["LLMD_HEADER", "SplitDecision", "cache_match_body", "decide", "host_port",
           "llmd_headers", "sglang_body", "vllm_decode_body", "vllm_prefill_body"]

LLMD_HEADER = "x-prefiller-host-port"
VLLM_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}


@dataclass(frozen=True)
class SplitDecision:
    """``split`` or colocate, with its ``reason`` (logged, a metric label): ``short_uncached``,
    ``prefix_hit``, ``split``, ``prefill_failed`` (a split that fell back to decode-only)."""

    split: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens the decode side does not hold."""
        return max(0, self.prompt_tokens - self.cached_tokens)


def decide(prompt_tokens: int, cached_tokens: int, pd: PDSettings) -> SplitDecision:
    """Split unless the uncached part is under ``split_min_uncached_tokens`` (``short_uncached``)
    or the decode side's hit covers ``colocate_min_cached_fraction`` of the prompt
    (``prefix_hit``). Token counts are clipped to ``0 <= cached <= prompt``."""
    prompt = max(0, prompt_tokens)
    cached = max(0, min(cached_tokens, prompt))
    uncached = prompt - cached
    if uncached < pd.split_min_uncached_tokens:
        return SplitDecision(False, "short_uncached", prompt, cached)
    if prompt and cached / prompt >= pd.colocate_min_cached_fraction:
        return SplitDecision(False, "prefix_hit", prompt, cached)
    return SplitDecision(True, "split", prompt, cached)


def cache_match_body(body: dict[str, Any]) -> dict[str, Any] | None:
    """What to ask the decode side's ``/v1/cache/match`` (our engine's) for ``body``: a chat
    body as it is; a completions body with token ids as ``{"input_ids", "cache_salt"?}``; None
    for a text prompt (the proxy holds no tokenizer: the hit is then unknown)."""
    if "messages" in body:
        return body
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        out: dict[str, Any] = {"input_ids": prompt}
        if isinstance(body.get("cache_salt"), str):
            out["cache_salt"] = body["cache_salt"]
        return out
    return None


def vllm_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's prefill request (module docstring); ``body`` is not changed."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(VLLM_PREFILL_PARAMS)
    return out


def vllm_decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """vLLM's decode request: the client's body + the prefill answer's params, verbatim."""
    return {**body, "kv_transfer_params": kv_transfer_params}


def host_port(base_url: str) -> tuple[str, int]:
    """``(host, port)`` of a base URL (the scheme's default port when none is given)."""
    u = urlsplit(base_url)
    return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)


def sglang_body(body: dict[str, Any], prefill_url: str, bootstrap_port: int,
                room: int | None = None) -> dict[str, Any]:
    """SGLang's P/D body (the same to both sides): ``bootstrap_host`` / ``_port`` / ``_room``."""
    host, _ = host_port(prefill_url)
    return {**body, "bootstrap_host": host, "bootstrap_port": bootstrap_port,
            "bootstrap_room": secrets.randbits(63) if room is None else room}


def llmd_headers(prefill_url: str) -> dict[str, bytes]:
    """llm-d's header naming the prefill pod (``host:port``)."""
    host, port = host_port(prefill_url)
    return {LLMD_HEADER: f"{host}:{port}".encode()}
