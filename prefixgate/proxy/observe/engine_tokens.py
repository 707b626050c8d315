"""The backend's own token ids of a chat request, from its ``POST /tokenize`` endpoint.

Self-hosted OpenAI-compatible engines render a chat request with the model's chat template; the
exact ids (where the tools go, what the template adds) decide what their radix cache can reuse.
vLLM serves ``POST /tokenize`` (vLLM docs, "OpenAI-Compatible Server", Tokenizer API) and so does
our engine (``prefixgate/local_engine/server/tokenize.py``): ``{"model", "messages", "tools",
"add_generation_prompt": true} -> {"tokens": [int], "count": int, ...}``. The proxy asks it, after
the answer, for the ids of the client's ORIGINAL request, so the counterfactual
(:mod:`prefixgate.cache.provider_models.token_radix`) runs on the backend's real token sequence.

Bounded and failure-safe: one POST under ``timeout_s`` (whole call), an answer of at most
``MAX_ANSWER_BYTES``; any failure returns None (the caller falls back to the block model). A
backend that answers 404 / 405 / 501 has no tokenizer endpoint and is not asked again for
``retry_after_s`` seconds. Only ``local`` and ``openai_compat`` backends are asked; the path is
the backend's base URL without its ``/v1`` suffix, plus ``/tokenize``. The request carries the
backend's own key as a bearer token (never logged).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import orjson

from prefixgate.config.backend_kinds import traits
from prefixgate.proxy.bridges import bridge_for
from prefixgate.proxy.bridges.tokenize import tokenize_body, tokenize_url
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import Api, ProxyError
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import Upstream, read_at_most

log = logging.getLogger("prefixgate.engine_tokens")

#: Largest answer read (bytes): ~7 bytes per id, so about a million ids.
MAX_ANSWER_BYTES = 8 << 20
#: Statuses meaning "this server has no tokenizer endpoint".
UNSUPPORTED_STATUS = (404, 405, 501)


def request_body(api: Api, body: dict[str, Any], translated: bool,
                 max_depth: int) -> dict[str, Any]:
    """The ``/tokenize`` request for a client's chat ``body``: its messages and tools in the
    backend's (OpenAI) shape — bridged first when the client speaks another API — plus
    ``add_generation_prompt`` as generation renders it. Raises what the bridge raises."""
    chat = bridge_for(api, "openai").request(body, max_depth) if translated else body
    return tokenize_body(chat, add_generation_prompt=True)


def parse_ids(raw: bytes) -> list[int] | None:
    """``tokens`` of a ``/tokenize`` answer, or None when it is not a list of ints."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    ids = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        return None
    return ids


class EngineTokenizer:
    """Client of backends' ``/tokenize`` (see module docstring); one per proxy process.

    ``timeout_s``: bound on one whole call (seconds); ``retry_after_s``: how long a backend
    without the endpoint is not asked again.
    """

    def __init__(self, timeout_s: float = 5.0, retry_after_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._skip_until: dict[str, float] = {}

    def supports(self, target: Target) -> bool:
        """Whether ``target``'s backend is one to ask now."""
        if not traits(target.backend.kind).tokenizes:
            return False
        return time.monotonic() >= self._skip_until.get(target.backend_name, 0.0)

    async def ids(self, upstream: Upstream, target: Target, api: Api, body: dict[str, Any],
                  max_depth: int) -> list[int] | None:
        """Token ids of the client's ``body`` as ``target``'s backend renders it, or None
        (backend kind not served, endpoint missing, error, timeout, malformed answer).
        Never raises (cancellation excepted)."""
        if not self.supports(target):
            return None
        try:
            payload = exactjson.dumps(request_body(api, body, target.translate, max_depth))
            key = target.api_key()
        except (ProxyError, TypeError, ValueError, KeyError):
            return None
        headers = {"content-type": b"application/json"}
        if key:
            headers["authorization"] = b"Bearer " + key.encode("latin-1", "replace")
        with anyio.move_on_after(self.timeout_s):
            return await self._ask(upstream, target, headers, payload)
        log.warning("tokenize on backend %s over %.1f s; modelled instead", target.backend_name,
                 self.timeout_s)
        return None

    async def _ask(self, upstream: Upstream, target: Target, headers: dict[str, bytes],
                   payload: bytes) -> list[int] | None:
        try:
            resp = await upstream.send(tokenize_url(target.backend.base_url), headers, payload,
                                       self.timeout_s)
        except ProxyError:
            return None
        try:
            if resp.status_code in UNSUPPORTED_STATUS:
                self._skip_until[target.backend_name] = time.monotonic() + self.retry_after_s
                log.debug("backend %s has no /tokenize (%d); counterfactual modelled",
                          target.backend_name, resp.status_code)
                return None
            if resp.status_code != 200:
                return None
            return parse_ids(await read_at_most(resp, MAX_ANSWER_BYTES))
        except Exception:  # a body cut off mid-read: no ids, no harm
            return None
        finally:
            with anyio.CancelScope(shield=True):  # closed even when the time bound cancels us
                await resp.aclose()
