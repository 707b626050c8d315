"""Proxy keys: who may use the proxy, and how much (issue 8, class 9; issue 20 High 3 and 4).

Without keys in the policy (``auth.keys`` / ``auth.keys_file``) every request is served, as
before — allowed only while the proxy listens on a loopback address (:func:`needs_keys`;
``prefixgate serve`` refuses to start otherwise). With keys, a request to a model endpoint
(``/v1/chat/completions``, ``/v1/messages``) must carry one: ``Authorization: Bearer <key>``
(OpenAI SDKs) or ``x-api-key: <key>`` (Anthropic SDKs); either header is read on either
endpoint, and on ``/v1/models`` (it asks the backends live and names them). No valid key: 401 in
the caller's shape. ``/healthz`` and ``/metrics`` stay open (probes and Prometheus scrapers
carry no key; they show counts and backend names, no prompt, no key). Once keys are required
they stay required: a keys file that is emptied, deleted or broken while the proxy runs never
opens it (:mod:`prefixgate.proxy.http.keystore`).

Storage: only ``sha256:<hex>`` of each key. A key is ``pgk-`` + 43 URL-safe characters (256
random bits, :func:`secrets.token_urlsafe`), so a fast hash is enough: a slow password KDF
(bcrypt, scrypt) protects low-entropy secrets; guessing a 256-bit key from its SHA-256 is not
feasible. The presented key's hash is compared with EVERY stored hash by
:func:`hmac.compare_digest`, no early exit, so the time taken says nothing about which bytes or
which key matched. The key's public ``id`` (never the key) goes into the ledger.

Limits charge what is spent (:meth:`Guard.limit`, :meth:`Guard.settle`), for a key with ``tpm``:

1. at admission, atomically with the check, the prompt as the proxy counts it
   (:func:`prefixgate.proxy.http.ratelimit.prompt_estimate`: JSON text / 4, media at a fixed
   cost) — so a stream that never reports usage, or a client that leaves before it does, has
   spent its prompt;
2. while the answer streams, the output seen so far (the stream's usage, else its content
   events, ~1 token each on OpenAI-style streams) is added to the key's window before each later
   admission of the same key in this process (:class:`~prefixgate.proxy.http.ratelimit.Ticket`);
3. at the end, the difference between what was charged and what the request spent: the
   backend's usage where it reported one (prompt and output separately), the estimate and the
   content events where not. A request refused with a 4xx (the proxy's, after admission, or the
   backend's; not 408 / 499) without usage spent nothing and gets its estimate back.

A request is charged once: after step 3 the window holds exactly ``usage.prompt + usage.output``
for it (within one window; a difference settled in a later window is added there when positive,
dropped when negative).
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import secrets
import weakref
from collections.abc import Mapping
from typing import Any

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.config.schema import AuthSettings, LedgerSettings, ProxyKey
from prefixgate.proxy.core.errors import Api, RateLimited, Unauthorized
from prefixgate.proxy.http.keystore import KeyStore, hash_key
from prefixgate.proxy.http.ratelimit import (
    Limiter,
    MemoryLimiter,
    RedisLimiter,
    Refusal,
    Ticket,
    prompt_estimate,
)

__all__ = ["Guard", "KeyStore", "MemoryLimiter", "hash_key", "needs_keys", "new_key",
           "new_key_id", "presented_key"]

log = logging.getLogger("prefixgate.auth")

KEY_PREFIX = "pgk-"


def new_key() -> str:
    """A fresh proxy key: ``pgk-`` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """A fresh public key id: ``k_`` + 12 hex digits."""
    return "k_" + secrets.token_hex(6)


def presented_key(headers: Mapping[str, str], api: Api) -> str | None:
    """The key a request carries: ``x-api-key`` or ``Authorization: Bearer`` (the ``api``'s own
    header first), or the password of ``Authorization: Basic`` (RFC 7617; any user name: what a
    browser sends for the dashboard, see :mod:`prefixgate.proxy.observe.dashboard`); None when none
    holds one."""
    bearer = headers.get("authorization", "")
    scheme, _, token = bearer.strip().partition(" ")
    from_bearer = (token.strip() if scheme.lower() == "bearer" else
                   basic_password(token) if scheme.lower() == "basic" else "")
    from_x = headers.get("x-api-key", "").strip()
    first, second = (from_x, from_bearer) if api == "anthropic" else (from_bearer, from_x)
    return first or second or None


def basic_password(token: str) -> str:
    """The password in an HTTP Basic credential (base64 of ``user:password``, RFC 7617), or ""
    when ``token`` is not valid base64 of text holding a colon."""
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return ""
    _, colon, password = decoded.partition(":")
    return password.strip() if colon else ""


def needs_keys(host: str) -> bool:
    """Whether listening on ``host`` requires proxy keys: anything but a loopback address
    (``127.0.0.0/8``, ``::1``, ``localhost``). ``0.0.0.0`` / ``::`` (every interface) and any
    name that is not ``localhost`` do."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return False
    try:
        return not ipaddress.ip_address(h).is_loopback
    except ValueError:
        return True  # a host name: it may resolve to anything


def _refused(key_id: str, refusal: Refusal) -> RateLimited:
    return RateLimited(f"Rate limit reached for proxy key {key_id} on {refusal.kind} per minute: "
                       f"limit {refusal.limit}. Retry in {refusal.retry_after_s} s.",
                       refusal.retry_after_s, kind=refusal.kind)


class Guard:
    """Authentication + rate limits for model requests. ``store``: the keys; ``limiter``: the
    counters (:func:`limiter_for`)."""

    def __init__(self, store: KeyStore, limiter: Limiter) -> None:
        self.store = store
        self.limiter = limiter
        self._open: dict[str, weakref.WeakSet[Ticket]] = {}  # key id -> tickets in flight

    @classmethod
    def open(cls) -> Guard:
        """A guard with no keys: every request admitted, key id ""."""
        return cls(KeyStore(AuthSettings()), MemoryLimiter())

    @classmethod
    def from_policy(cls, auth: AuthSettings, ledger: LedgerSettings,
                    link: RedisLink | None = None) -> Guard:
        """The guard for a policy's ``auth`` section; counters in Redis through ``link`` (the
        app's one link on ``ledger.redis_url``, keys under ``ledger.redis_prefix``), in memory
        without one."""
        del ledger  # the link carries the URL and the prefix
        return cls(KeyStore(auth), limiter_for(link))

    async def drain(self) -> None:
        """Wait for the limiter's writes in flight (the app's shutdown)."""
        drain = getattr(self.limiter, "drain", None)
        if drain is not None:
            await drain()

    def reasons(self) -> list[str]:
        """Why the guard is degraded (``/healthz`` reasons; empty: it is not)."""
        return self.store.reasons()

    async def admit(self, headers: Mapping[str, str], api: Api, limit: bool = False) -> str:
        """The caller's key id ("" when no keys are required). Raises Unauthorized (401) for a
        missing or unknown key. ``limit``: also count one request against the key's ``rpm`` /
        ``tpm`` (RateLimited, 429 + ``retry-after``) charging no tokens; model requests use
        :meth:`limit` once their body is read instead."""
        if not self.store.configured:
            return ""
        key = presented_key(headers, api)
        found = self.store.lookup(key) if key else None
        if found is None:
            what = "No proxy key provided" if not key else "Incorrect proxy key provided"
            raise Unauthorized(f"{what}. Send the key prefixgate gave you as 'Authorization: "
                               "Bearer <key>' (OpenAI SDKs) or 'x-api-key: <key>' (Anthropic "
                               "SDKs).")
        if limit:
            await self.limit(found.id, None, 0, count_tokens=False)
        return found.id

    def _key(self, key_id: str) -> ProxyKey | None:
        return next((k for k in self.store.keys() if k.id == key_id), None) if key_id else None

    async def limit(self, key_id: str, body: Any, size: int,
                    count_tokens: bool = True) -> Ticket | None:
        """Admit one request of ``key_id`` under its limits, charging its prompt estimate
        (``body``: the parsed request, ``size``: its bytes; ``count_tokens`` False: a request
        that spends no model tokens, e.g. count_tokens). Raises RateLimited (429 +
        ``retry-after``). Returns the Ticket to :meth:`settle` (None: the key has no limit)."""
        found = self._key(key_id)
        if found is None or (found.rpm is None and found.tpm is None):
            return None
        counts = found.tpm is not None and count_tokens
        estimate = await prompt_estimate(body, size) if counts else 0
        open_ = self._open.get(key_id, ())
        pending = sum(t.pending() for t in list(open_))
        window = self.limiter.window()
        refusal = await self.limiter.admit(key_id, found.rpm, found.tpm, estimate, pending)
        if refusal is not None:
            raise _refused(key_id, refusal)
        ticket = Ticket(key_id, window, estimate, tokens=counts)
        if counts:
            self._open.setdefault(key_id, weakref.WeakSet()).add(ticket)
        return ticket

    def settle(self, ticket: Ticket | None, prompt_tokens: int | None,
               output_tokens: int | None, http_status: int) -> None:
        """Charge what the request spent beyond what its ticket was charged (module docstring,
        step 3); once per ticket. ``prompt_tokens`` / ``output_tokens``: the backend's usage
        (None: not reported; ``output_tokens`` may be the proxy's count of content events).
        Never raises."""
        if ticket is None or ticket.settled or not ticket.tokens:
            return
        try:
            ticket.settled = True
            open_ = self._open.get(ticket.key_id)
            if open_ is not None:
                open_.discard(ticket)
                if not open_:
                    self._open.pop(ticket.key_id, None)
            refused = 400 <= http_status < 500 and http_status not in (408, 499)
            if refused and prompt_tokens is None and not output_tokens:
                spent = 0
            else:
                prompt = ticket.estimate if prompt_tokens is None else prompt_tokens
                seen = ticket.output + ticket.unseen()
                spent = prompt + (seen if output_tokens is None else output_tokens)
            delta = spent - ticket.charged
            if self.limiter.window() == ticket.window:
                self.limiter.add_tokens(ticket.key_id, delta, ticket.window)
            elif delta > 0:  # spent now: counts in the window it is spent in
                self.limiter.add_tokens(ticket.key_id, delta)
        except Exception:  # a counter failure must not fail the request's record
            log.exception("rate limiter: tokens not counted")


def limiter_for(link: RedisLink | None) -> Limiter:
    """A RedisLimiter through ``link`` when there is one, else a MemoryLimiter."""
    return RedisLimiter(link) if link is not None else MemoryLimiter()
