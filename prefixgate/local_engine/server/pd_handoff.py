"""vLLM's P/D contract on the engine's HTTP side: ``kv_transfer_params`` in, out.

The proxy (vLLM's ``disagg_proxy``, llm-d's sidecar, prefixgate's ``routing/pd/split.py``) sends
the *prefill* request with ``max_tokens: 1``, ``stream: false`` and
``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false, ...}``; the prefill
answer's ``kv_transfer_params`` go verbatim into the *decode* request (same prompt, the client's
own ``max_tokens`` / ``stream``), one ``X-Request-Id`` on both.

Prefill role: ask the decode peer how much of the prompt its radix tree holds
(``POST {peer}/v1/cache/match``; unreachable = 0) while the request runs (the round trip
overlaps the prefill), then export the KV of every prompt token the peer lacks. The answer
carries::

    {"do_remote_decode": false, "do_remote_prefill": true, "remote_engine_id": str,
     "remote_host": str, "remote_port": int, "remote_block_ids": [], "tp_size": 1,
     "transfer_id": int, "remote_cached_tokens": int, "transfer_tokens": int,
     "first_token_ids": [int], "transfer_tag": str}

(``transfer_tokens`` 0: nothing to send; ``kv_transfer_params`` null: the link is down, so the
decode side recomputes; ``transfer_tag``: the HMAC that binds the transfer id and the first
token ids to this prompt, keyed with the pair's secret, ``pd/auth.py``.) Decode role: check the
tag (a 400 at once when it does not verify: a made-up or replayed ticket, chosen first tokens),
claim the import of ``transfer_id`` (waiting for it up to the link timeout on the handoff's own
bounded threads, :data:`MAX_CLAIM_WAITERS` at a time: a claim beyond them, or of a transfer
already claimed, recomputes at once), run the request with ``first_token_ids`` as its first completion tokens
(``Engine.generate(given_ids=)``: streamed at once, no forward recomputes the prompt's last
token; their K/V is computed by the step that samples the next token), and drop the import's
lock when the request ends.

Bad input is a 400 naming ``kv_transfer_params``: a dict is required, ``do_remote_decode`` only
on a prefill instance, ``do_remote_prefill`` only on a decode one with an integer
``transfer_id``, a ``transfer_tag`` and, optionally, ``first_token_ids`` (a list of at most
``MAX_FIRST_TOKENS`` token ids).

Prompt tokens by source (vLLM's ``prompt_tokens_by_source``: ``computed``,
``local_cache_hit``, ``external_kv_transfer``) are counted here for every request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from prefixgate.local_engine.pd.auth import ticket_tag, verify_ticket
from prefixgate.local_engine.pd.link import LinkDead
from prefixgate.local_engine.pd.roles import DecodeRole, PendingImport, PrefillRole
from prefixgate.local_engine.server.protocol import ApiError

__all__ = ["PDHandoff", "PDRequest", "parse_kv_transfer_params", "prompt_sources"]

log = logging.getLogger("local_engine.server.pd")

SOURCES = ("computed", "local_cache_hit", "external_kv_transfer")
MAX_FIRST_TOKENS = 8  # first tokens a decode request may carry (the prefill side sends one)
MAX_TOKEN_ID = 1 << 31
MAX_CLAIM_WAITERS = 16
"""Decode requests that may wait for their transfer at once (each holds one of the handoff's
own threads up to the link timeout; tokenizing and the rest of the server never wait behind
them). A claim beyond them recomputes at once (``kv_transfer_failures_total:claims_busy``)."""
EXPORT_THREADS = 4


@dataclass(frozen=True)
class PDRequest:
    """A parsed ``kv_transfer_params``: ``kind`` ``prefill`` (do_remote_decode) or ``decode``
    (do_remote_prefill) and, for decode, the ``transfer_id`` (0: nothing was sent) and the
    prefill side's ``first_token_ids`` (empty: the decode side samples the first token)."""

    kind: str
    transfer_id: int = 0
    raw: dict[str, Any] | None = None
    first_token_ids: tuple[int, ...] = ()
    tag: str | None = None


def _err(msg: str) -> ApiError:
    return ApiError(msg, param="kv_transfer_params", code="invalid_value")


def parse_kv_transfer_params(value: Any, role: str) -> PDRequest | None:
    """Validate a request's ``kv_transfer_params`` for an engine of ``role`` (``prefill``,
    ``decode``, ``both``); None when absent or asking for neither side. Raises ``ApiError``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _err("Invalid type for 'kv_transfer_params': expected an object.")
    remote_decode = value.get("do_remote_decode", False)
    remote_prefill = value.get("do_remote_prefill", False)
    if not isinstance(remote_decode, bool) or not isinstance(remote_prefill, bool):
        raise _err("'do_remote_decode' and 'do_remote_prefill' must be booleans.")
    if remote_decode and remote_prefill:
        raise _err("'do_remote_decode' and 'do_remote_prefill' cannot both be true.")
    if remote_decode:
        if role != "prefill":
            raise _err(f"This engine runs as '{role}', not as a prefill instance "
                       "(do_remote_decode).")
        return PDRequest("prefill", raw=value)
    if remote_prefill:
        if role != "decode":
            raise _err(f"This engine runs as '{role}', not as a decode instance "
                       "(do_remote_prefill).")
        tid = value.get("transfer_id", 0)
        if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
            raise _err("'transfer_id' must be a non-negative integer (the prefill answer's).")
        if tid >= 1 << 63:
            raise _err("'transfer_id' is out of range.")
        first = value.get("first_token_ids") or []
        if not isinstance(first, list) or len(first) > MAX_FIRST_TOKENS or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID
                for t in first):
            raise _err(f"'first_token_ids' must be a list of at most {MAX_FIRST_TOKENS} "
                       "token ids (the prefill answer's).")
        tag = value.get("transfer_tag")
        if not isinstance(tag, str):
            raise _err("'transfer_tag' is missing: decode requests carry the prefill answer's "
                       "kv_transfer_params as they came.")
        return PDRequest("decode", transfer_id=tid, raw=value, first_token_ids=tuple(first),
                         tag=tag)
    return None


def prompt_sources(prompt_tokens: int, cached_tokens: int, external_tokens: int) -> dict[str, int]:
    """Split a request's prompt tokens by where their KV came from: ``external_kv_transfer``
    (imported for this request and hit: at most ``cached_tokens``), ``local_cache_hit`` (the
    rest of the cache hit), ``computed`` (prefilled here)."""
    cached = max(0, min(cached_tokens, prompt_tokens))
    ext = max(0, min(external_tokens, cached))
    return {"computed": prompt_tokens - cached, "local_cache_hit": cached - ext,
            "external_kv_transfer": ext}


class PDHandoff:
    """The server's P/D hooks for one engine of ``role``: ``prefill`` (with ``prefill_role``
    and the decode peer's ``peer_url``), ``decode`` (with ``decode_role``) or ``both``
    (no P/D: only the prompt-source counters)."""

    def __init__(self, role: str = "both", prefill_role: PrefillRole | None = None,
                 decode_role: DecodeRole | None = None, peer_url: str | None = None,
                 engine_id: str = "prefixgate", host: str = "127.0.0.1", port: int = 0) -> None:
        self.role = role
        self.prefill_role = prefill_role
        self.decode_role = decode_role
        self.peer_url = peer_url.rstrip("/").removesuffix("/v1") if peer_url else None
        self.engine_id, self.host, self.port = engine_id, host, port
        self.sources: Counter[str] = Counter()
        self._client: httpx.AsyncClient | None = None
        self._claims = ThreadPoolExecutor(MAX_CLAIM_WAITERS, thread_name_prefix="pd-claim")
        self._exports = ThreadPoolExecutor(EXPORT_THREADS, thread_name_prefix="pd-export")
        self._waiting = 0  # claims on the pool now (event loop thread only)
        self.claims_busy = 0

    def parse(self, job_extra: dict[str, Any] | None) -> PDRequest | None:
        """The request's P/D part (``parse_kv_transfer_params``) from its extra fields."""
        return parse_kv_transfer_params((job_extra or {}).get("kv_transfer_params"), self.role)

    def ask_peer(self, pd: PDRequest | None, prompt: list[int],
                 extra_key: bytes | None) -> asyncio.Task[int] | None:
        """Prefill side: start ``peer_cached`` now (it runs while the request prefills); None
        for any other request."""
        if pd is None or pd.kind != "prefill":
            return None
        return asyncio.create_task(self.peer_cached(prompt, extra_key))

    async def peer_cached(self, prompt: list[int], extra_key: bytes | None) -> int:
        """Tokens of ``prompt`` the decode peer's tree holds (0 when it cannot say)."""
        if self.peer_url is None:
            return 0
        body: dict[str, Any] = {"input_ids": prompt}
        if extra_key:
            body["cache_salt"] = extra_key.decode()
        try:
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=2.0)
            r = await self._client.post(f"{self.peer_url}/v1/cache/match", json=body)
            r.raise_for_status()
            return max(0, int(r.json().get("cached_tokens", 0)))
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            log.warning("decode peer's cache match failed (%s); sending the whole prompt",
                        type(exc).__name__)
            return 0

    def check_ticket(self, pd: PDRequest | None, prompt: list[int],
                     extra_key: bytes | None) -> None:
        """Decode side: raise ``ApiError`` (400) unless ``pd``'s ``transfer_tag`` is the paired
        prefill instance's for this prompt, transfer id and first tokens (``pd.auth``)."""
        if pd is None or pd.kind != "decode":
            return
        secret = getattr(getattr(self.decode_role, "link", None), "secret", None)
        if secret is None or not verify_ticket(secret, pd.tag, pd.transfer_id,
                                               pd.first_token_ids, prompt, extra_key):
            raise _err("'kv_transfer_params' were not issued for this prompt by this decode "
                       "instance's prefill peer ('transfer_tag' does not verify).")

    async def before(self, pd: PDRequest | None, prompt: list[int] | None = None,
                     extra_key: bytes | None = None) -> PendingImport | None:
        """Decode side: the claimed import of the request's transfer (None: recompute).
        ``prompt`` given: the ticket is checked first (``check_ticket``). The wait runs on the
        handoff's own threads, at most :data:`MAX_CLAIM_WAITERS` at once."""
        if prompt is not None:
            self.check_ticket(pd, prompt, extra_key)
        if pd is None or pd.kind != "decode" or pd.transfer_id == 0 or self.decode_role is None:
            return None
        if self._waiting >= MAX_CLAIM_WAITERS:
            self.claims_busy += 1
            return None
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._claims, self.decode_role.claim,
                                              pd.transfer_id)
        finally:
            self._waiting -= 1

    def admitted(self, pending: PendingImport | None) -> None:
        """The request is over (or holds its own lock): drop the import's."""
        if pending is not None and self.decode_role is not None:
            self.decode_role.unclaim(pending)

    async def hold(self, pending: PendingImport | None, outputs: AsyncIterator[Any]
                   ) -> AsyncGenerator[Any, None]:
        """``outputs``, keeping ``pending``'s lock until they end or are closed (a request whose
        first token came with the transfer emits it before its admission locks the prefix)."""
        try:
            async for out in outputs:
                yield out
        finally:
            close = getattr(outputs, "aclose", None)
            if close is not None:
                await close()
            self.admitted(pending)

    async def after(self, pd: PDRequest | None, prompt: list[int], extra_key: bytes | None,
                    peer: asyncio.Task[int] | None, first_token_ids: list[int]
                    ) -> dict[str, Any] | None:
        """Prefill side, once the request ran: export the KV of the prompt beyond what ``peer``
        (``ask_peer``) says the decode side holds and return the answer's
        ``kv_transfer_params`` (None when the link is down: the decode side recomputes)."""
        if pd is None or pd.kind != "prefill" or self.prefill_role is None:
            if peer is not None:
                peer.cancel()
            return None
        peer_cached = await peer if peer is not None else 0
        try:
            loop = asyncio.get_running_loop()
            ticket = await loop.run_in_executor(self._exports, self.prefill_role.export, prompt,
                                                extra_key, peer_cached)
        except (LinkDead, ValueError) as exc:
            log.warning("P/D export skipped: %s", exc)
            return None
        first = [int(t) for t in first_token_ids][:MAX_FIRST_TOKENS]
        tag = ticket_tag(self.prefill_role.link.secret, ticket.transfer_id, first, prompt,
                         extra_key)
        return {
            "do_remote_decode": False, "do_remote_prefill": True,
            "remote_engine_id": self.engine_id, "remote_host": self.host,
            "remote_port": self.port, "remote_block_ids": [], "tp_size": 1,
            "transfer_id": ticket.transfer_id, "remote_cached_tokens": ticket.start,
            "transfer_tokens": ticket.num_tokens, "first_token_ids": first,
            "transfer_tag": tag,
        }

    def close(self) -> None:
        """Stop the handoff's threads (claims still waiting end with the link: ``stop`` the
        role first)."""
        self._claims.shutdown(wait=False, cancel_futures=True)
        self._exports.shutdown(wait=False, cancel_futures=True)

    def link_health(self) -> dict[str, Any] | None:
        """The P/D link's state for ``/health`` (None on a colocated engine): ``role``, ``up``,
        ``pairings`` and ``repairs`` (pairings after the first: a peer was lost and came back)."""
        role = self.prefill_role or self.decode_role
        if role is None:
            return None
        s = role.stats()
        return {"role": self.role, "up": bool(s.get("kv_link_up")),
                "pairings": int(s.get("kv_link_pairings_total", 0)),
                "repairs": int(s.get("kv_link_repairs_total", 0))}

    def record(self, prompt_tokens: int, cached_tokens: int, external_tokens: int) -> None:
        """Count one request's prompt tokens by source (``prompt_sources``)."""
        self.sources.update(prompt_sources(prompt_tokens, cached_tokens, external_tokens))

    def stats(self) -> dict[str, Any]:
        """``prompt_tokens_by_source:<source>`` counters and the role's ``kv_transfer_*``."""
        out: dict[str, Any] = {f"prompt_tokens_by_source:{s}": self.sources[s] for s in SOURCES}
        role = self.prefill_role or self.decode_role
        if role is not None:
            out.update(role.stats())
        if self.decode_role is not None:
            out["kv_transfer_failures_total:claims_busy"] = self.claims_busy
        return out
