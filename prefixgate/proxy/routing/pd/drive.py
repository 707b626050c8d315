"""P/D disaggregation, HTTP part: drive one request through a prefill + decode pair.

``PDDriver.drive`` asks the decode side how much of the prompt it holds (our engine's
``/v1/cache/match``, when ``pd.cache_match``: ``split.cache_match_body``), decides
(``split.decide``) and then:

- colocate: the client's body to the decode side alone (it prefills itself);
- ``vllm``: the prefill request, then the decode request with the prefill answer's
  ``kv_transfer_params``; a prefill that fails (status, unreachable, no params) falls back to
  decode-only (what llm-d does), decision reason ``prefill_failed``;
- ``sglang``: the same bootstrap body to both at once, the decode answer returned, the prefill
  answer read and closed in the background;
- ``llmd``: the body to the decode pod with ``x-prefiller-host-port``.

Every upstream request of one client request carries one ``X-Request-Id``. The answer returned
is the decode side's, unread (stream mode): the caller relays and closes it. Decisions are
counted in ``DECISIONS`` ``(decision, reason) -> n`` and logged with their reason (no prompt
text).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import orjson

from prefixgate.config.pd_settings import PDSettings
from prefixgate.proxy.routing.pd.split import (
    SplitDecision,
    cache_match_body,
    decide,
    llmd_headers,
    sglang_body,
    vllm_decode_body,
    vllm_prefill_body,
)

__all__ = ["DECISIONS", "LINKS", "PDDriver", "SendFn", "link_state"]

log = logging.getLogger("prefixgate.pd")

SendFn = Callable[[str, Mapping[str, bytes], bytes, float], Awaitable[httpx.Response]]
DECISIONS: Counter[tuple[str, str]] = Counter()
LINKS: dict[str, tuple[bool, float]] = {}
"""Prefill URL -> (whether its last answer carried ``kv_transfer_params``, when: epoch s). An
answer 200 with ``kv_transfer_params: null`` means the engine pair's KV link is down (the split
ran decode-only): ``/healthz`` says so per backend (issue 34, item 9)."""
MAX_PREFILL_ANSWER = 1 << 20  # bytes read of a prefill answer (one token + params)


def _estimate_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens when the decode side cannot tell: ~4 bytes a token of the messages."""
    return len(orjson.dumps(body.get("messages") or body.get("prompt") or "")) // 4


class PDDriver:
    """Drives P/D pairs through ``send(url, headers, body, timeout_s)`` (the upstream client's
    ``send``: stream mode, raises the proxy's 502 / 504 errors)."""

    def __init__(self, send: SendFn) -> None:
        self.send = send
        self._background: set[asyncio.Task[None]] = set()

    async def decode_hit(self, pd: PDSettings, body: dict[str, Any],
                         headers: Mapping[str, bytes]) -> tuple[int, int]:
        """``(prompt_tokens, cached_tokens)`` on the decode side; an estimate and 0 when it
        cannot answer."""
        ask = cache_match_body(body) if pd.cache_match else None
        if ask is not None:
            try:
                r = await self.send(pd.decode + "/cache/match", headers, orjson.dumps(ask), 5.0)
                try:
                    raw = await r.aread()
                finally:
                    await r.aclose()
                if r.status_code == 200:
                    got = orjson.loads(raw)
                    return int(got["prompt_tokens"]), int(got["cached_tokens"])
            except Exception as exc:  # any failure: decide without the hit
                log.info("P/D cache match failed (%s)", type(exc).__name__)
        return _estimate_tokens(body), 0

    async def drive(self, pd: PDSettings, path: str, body: dict[str, Any],
                    headers: Mapping[str, bytes], request_id: str | None = None
                    ) -> tuple[httpx.Response, SplitDecision]:
        """Send ``body`` (the client's, in the backend's API) to ``path`` (``/chat/completions``)
        of the pair; returns the decode side's response and the decision."""
        rid = request_id or uuid.uuid4().hex
        hdrs = {**headers, "x-request-id": rid.encode()}
        prompt, cached = await self.decode_hit(pd, body, hdrs)
        dec = decide(prompt, cached, pd)
        if dec.split:
            if pd.protocol == "vllm":
                resp, dec = await self._vllm(pd, path, body, hdrs, dec)
            elif pd.protocol == "sglang":
                resp = await self._sglang(pd, path, body, hdrs)
            else:
                resp = await self.send(pd.decode + path, {**hdrs, **llmd_headers(pd.prefill)},
                                       orjson.dumps(body), pd.timeout_s)
        else:
            resp = await self.send(pd.decode + path, hdrs, orjson.dumps(body), pd.timeout_s)
        DECISIONS[("split" if dec.split else "colocate", dec.reason)] += 1
        log.info("P/D %s (%s): prompt %d, decode-side hit %d, protocol %s",
                 "split" if dec.split else "colocate", dec.reason, dec.prompt_tokens,
                 dec.cached_tokens, pd.protocol)
        return resp, dec

    async def _vllm(self, pd: PDSettings, path: str, body: dict[str, Any],
                    hdrs: Mapping[str, bytes], dec: SplitDecision
                    ) -> tuple[httpx.Response, SplitDecision]:
        params: Any = None
        try:
            r = await self.send(pd.prefill + path, hdrs, orjson.dumps(vllm_prefill_body(body)),
                                pd.timeout_s)
            try:
                raw = await r.aread()
            finally:
                await r.aclose()
            if r.status_code == 200 and len(raw) <= MAX_PREFILL_ANSWER:
                params = orjson.loads(raw).get("kv_transfer_params")
                LINKS[pd.prefill] = (params is not None, time.time())
        except Exception as exc:  # the prefill side failed: the decode side prefills itself
            log.warning("P/D prefill failed (%s); decode-only", type(exc).__name__)
        if params is None:
            fallback = SplitDecision(False, "prefill_failed", dec.prompt_tokens, dec.cached_tokens)
            return await self.send(pd.decode + path, hdrs, orjson.dumps(body), pd.timeout_s), fallback
        return await self.send(pd.decode + path, hdrs,
                               orjson.dumps(vllm_decode_body(body, params)), pd.timeout_s), dec

    async def _sglang(self, pd: PDSettings, path: str, body: dict[str, Any],
                      hdrs: Mapping[str, bytes]) -> httpx.Response:
        raw = orjson.dumps(sglang_body(body, pd.prefill, pd.bootstrap_port))
        pre, dec = await asyncio.gather(self.send(pd.prefill + path, hdrs, raw, pd.timeout_s),
                                        self.send(pd.decode + path, hdrs, raw, pd.timeout_s),
                                        return_exceptions=True)
        if isinstance(pre, httpx.Response):
            task = asyncio.create_task(_drain(pre))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if isinstance(dec, BaseException):
            raise dec
        return dec


def link_state(pd: PDSettings) -> dict[str, Any]:
    """What the proxy last saw of ``pd``'s KV link (``LINKS``): ``{"link": "up" | "down" |
    "unknown", "seen_s_ago": float | None}`` (vLLM protocol only: the others carry no params)."""
    seen = LINKS.get(pd.prefill)
    if seen is None:
        return {"link": "unknown", "seen_s_ago": None}
    return {"link": "up" if seen[0] else "down", "seen_s_ago": round(time.time() - seen[1], 1)}


async def _drain(resp: httpx.Response) -> None:
    """Read and close a response nobody relays (SGLang's prefill answer)."""
    try:
        await resp.aread()
    except Exception:
        pass
    finally:
        await resp.aclose()
