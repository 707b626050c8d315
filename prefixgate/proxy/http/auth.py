"""Proxy keys: who may use the proxy, and how much (issue 8, class 9).

Without keys in the policy (``auth.keys`` / ``auth.keys_file``) every request is served, as
before — allowed only while the proxy listens on a loopback address (:func:`needs_keys`;
``prefixgate serve`` refuses to start otherwise). With keys, a request to a model endpoint
(``/v1/chat/completions``, ``/v1/messages``) must carry one: ``Authorization: Bearer <key>``
(OpenAI SDKs) or ``x-api-key: <key>`` (Anthropic SDKs); either header is read on either
endpoint, and on ``/v1/models`` (it asks the backends live and names them). No valid key: 401 in
the caller's shape. ``/healthz`` and ``/metrics`` stay open (probes and Prometheus scrapers
carry no key; they show counts and backend names, no prompt, no key).

Storage: only ``sha256:<hex>`` of each key. A key is ``pgk-`` + 43 URL-safe characters (256
random bits, :func:`secrets.token_urlsafe`), so a fast hash is enough: a slow password KDF
(bcrypt, scrypt) protects low-entropy secrets; guessing a 256-bit key from its SHA-256 is not
feasible. The presented key's hash is compared with EVERY stored hash by
:func:`hmac.compare_digest`, no early exit, so the time taken says nothing about which bytes or
which key matched. The key's public ``id`` (never the key) goes into the ledger.

The keys file is re-read when its mtime changes (checked at most once a second), so keys added
or removed with ``prefixgate keys`` take effect without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Mapping

import anyio

from prefixgate.config.loader import PolicyError, load_keys_file
from prefixgate.config.schema import AuthSettings, LedgerSettings, ProxyKey
from prefixgate.proxy.core.errors import Api, RateLimited, Unauthorized
from prefixgate.proxy.http.ratelimit import Limiter, MemoryLimiter, RedisLimiter

log = logging.getLogger("prefixgate.auth")

KEY_PREFIX = "pgk-"
RELOAD_EVERY_S = 1.0


def new_key() -> str:
    """A fresh proxy key: ``pgk-`` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """A fresh public key id: ``k_`` + 12 hex digits."""
    return "k_" + secrets.token_hex(6)


def hash_key(key: str) -> str:
    """What is stored for ``key``: ``sha256:`` + 64 hex digits of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


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


class KeyStore:
    """The policy's keys: inline ``auth.keys`` plus the ``auth.keys_file`` ones (re-read on
    change). ``clock``: monotonic seconds (tests)."""

    def __init__(self, settings: AuthSettings, clock: object = time.monotonic) -> None:
        self._inline = list(settings.keys)
        self._file = settings.keys_file
        self._clock = clock
        self._file_keys: list[ProxyKey] = []
        self._mtime: float | None = None
        self._checked = float("-inf")
        self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        if self._file is None:
            return
        now = self._clock()  # type: ignore[operator]
        if not force and now - self._checked < RELOAD_EVERY_S:
            return
        self._checked = now
        try:
            mtime = os.stat(self._file).st_mtime_ns
        except OSError:
            mtime = None
        if mtime == self._mtime and not force:
            return
        try:
            self._file_keys = load_keys_file(self._file)
            self._mtime = mtime
        except PolicyError as e:  # keep the keys we had; a half-written file must not open up
            log.error("keys file not reloaded: %s", e)

    def keys(self) -> list[ProxyKey]:
        """Every configured key (inline first), after a reload check."""
        self._reload()
        return self._inline + self._file_keys

    @property
    def configured(self) -> bool:
        """Whether any key is configured (then every model request needs one)."""
        return bool(self.keys())

    def lookup(self, key: str) -> ProxyKey | None:
        """The stored key whose hash matches ``key``, or None. Constant time in the key: every
        stored hash is compared with :func:`hmac.compare_digest`, no early exit."""
        digest = hash_key(key).encode()
        found: ProxyKey | None = None
        for k in self.keys():
            if hmac.compare_digest(digest, k.hash.encode()):
                found = k
        return found


class Guard:
    """Authentication + rate limits for model requests. ``store``: the keys; ``limiter``: the
    counters (:func:`limiter_for`)."""

    def __init__(self, store: KeyStore, limiter: Limiter, redis: bool = False) -> None:
        self.store = store
        self.limiter = limiter
        self._offload = redis  # Redis round trips go to a worker thread, not the event loop

    @classmethod
    def open(cls) -> Guard:
        """A guard with no keys: every request admitted, key id ""."""
        return cls(KeyStore(AuthSettings()), MemoryLimiter())

    @classmethod
    def from_policy(cls, auth: AuthSettings, ledger: LedgerSettings) -> Guard:
        """The guard for a policy's ``auth`` section; counters in Redis when
        ``ledger.redis_url`` is set, in memory otherwise."""
        return cls(KeyStore(auth), limiter_for(ledger.redis_url), ledger.redis_url is not None)

    async def admit(self, headers: Mapping[str, str], api: Api, limit: bool = True) -> str:
        """The caller's key id ("" when no keys are configured). Raises Unauthorized (401)
        for a missing or unknown key, RateLimited (429 + ``retry-after``) over its limits
        (``limit=False``: authenticate only, count nothing)."""
        if not self.store.configured:
            return ""
        key = presented_key(headers, api)
        found = self.store.lookup(key) if key else None
        if found is None:
            what = "No proxy key provided" if not key else "Incorrect proxy key provided"
            raise Unauthorized(f"{what}. Send the key prefixgate gave you as 'Authorization: "
                               "Bearer <key>' (OpenAI SDKs) or 'x-api-key: <key>' (Anthropic "
                               "SDKs).")
        if not limit or (found.rpm is None and found.tpm is None):
            return found.id
        if self._offload:
            refusal = await anyio.to_thread.run_sync(self.limiter.admit, found.id, found.rpm,
                                                     found.tpm)
        else:
            refusal = self.limiter.admit(found.id, found.rpm, found.tpm)
        if refusal is not None:
            raise RateLimited(f"Rate limit reached for proxy key {found.id} on {refusal.kind} "
                              f"per minute: limit {refusal.limit}. Retry in "
                              f"{refusal.retry_after_s} s.", refusal.retry_after_s,
                              kind=refusal.kind)
        return found.id

    def charge(self, key_id: str, prompt_tokens: int | None, output_tokens: int | None) -> None:
        """Add a finished request's tokens to its key's window (no-op without a key id or a
        token limit). Never raises."""
        if not key_id:
            return
        try:
            if not any(k.id == key_id and k.tpm is not None for k in self.store.keys()):
                return
            self.limiter.add_tokens(key_id, (prompt_tokens or 0) + (output_tokens or 0))
        except Exception:  # a counter failure must not fail the request's record
            log.exception("rate limiter: tokens not counted")


def limiter_for(redis_url: str | None) -> Limiter:
    """RedisLimiter on ``redis_url`` when set, else a MemoryLimiter."""
    return RedisLimiter(redis_url) if redis_url else MemoryLimiter()
