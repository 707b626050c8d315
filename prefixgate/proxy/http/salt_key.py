"""The secret the tenants' ``cache_salt`` is keyed with (issue 20, Medium 8).

A tenant's prefix-cache namespace on an engine (ours, vLLM >= 0.9) is the ``cache_salt`` the
proxy adds to its bodies (:mod:`prefixgate.proxy.http.tenants`). An unkeyed hash of the tenant's
name can be computed by anyone who guesses the name, and then read that tenant's cache through
the engine's port (``/v1/cache/match`` answered 169 of 169 cached blocks with acme's salt). So
the salt is keyed (:meth:`SaltKey.salt`)::

    cache_salt = HMAC-SHA256(key, "prefixgate-tenant-salt|v1|" + tenant
                                  [+ "|client|" + the client's own cache_salt]).hexdigest()

64 hex digits; without the key it is a pseudo-random function of the tenant (RFC 2104), so
knowing or guessing a tenant's name gives nothing.

The key (:meth:`SaltKey.key`), first usable source wins, read once per process:

1. ``tenants.salt_secret: ${ENV_VAR}`` — the variable's UTF-8 bytes, at least
   :data:`MIN_SECRET_BYTES`. Set but unset / shorter: **no key** (no fall back to the file:
   hosts of one fleet would silently send different salts);
2. else the per-install file :data:`DEFAULT_PATH` (``~/.cache/prefixgate/tenant_salt.key``):
   64 hex digits (32 random bytes, :func:`secrets.token_bytes`), created on first need with
   mode 0600 in a 0700 folder, atomically (temp file + ``link``: several workers starting at
   once all read the one that won). A file that exists but is not a regular file owned by this
   user, is readable or writable by group or others, or does not hold exactly 64 hex digits is
   **not used and not replaced** (someone else may have written it): no key.

Rule — fail closed: with no key, a request that has a tenant and goes to a backend that takes a
salt is refused (:class:`~prefixgate.proxy.core.errors.TenantSaltUnavailable`, 424) before
anything is sent; it is never sent unsalted nor with a salt computable without the key.
Requests without a tenant, and backends that take no salt, are not affected. While there is no
key the reason is logged once (``ERROR``) and listed by :meth:`SaltKey.reasons` (``/healthz``
503); a failed source is tried again at most every :data:`RETRY_S` seconds. The key is never
logged; the log names the variable or the file, the client's error names neither.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prefixgate.config.schema import TenantSettings
from prefixgate.config.secrets import MissingSecret, resolve_secret
from prefixgate.proxy.core.errors import TenantSaltUnavailable

log = logging.getLogger("prefixgate.tenants")

DEFAULT_PATH = Path("~/.cache/prefixgate/tenant_salt.key")
"""The per-install secret file (read when the key is first needed; tests point it elsewhere)."""
MIN_SECRET_BYTES = 32
"""Shortest ``salt_secret`` accepted: 256 bits if random; a shorter one is refused."""
RETRY_S = 5.0
"""Seconds between two tries of a source that failed."""
_DOMAIN = b"prefixgate-tenant-salt|v1|"
_HEX_CHARS = 64


class Unusable(Exception):
    """The configured source gives no key; the message is for the log (names the source)."""


class SaltKey:
    """The salt secret of one proxy process (module docstring). Thread-safe.

    ``settings``: the policy's ``tenants``; ``path``: the secret file (default
    :data:`DEFAULT_PATH`, read when first needed); ``clock``: monotonic seconds (tests)."""

    def __init__(self, settings: TenantSettings, path: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ref = settings.salt_secret
        self._path = path
        self._clock = clock
        self._key: bytes | None = None
        self._tried = float("-inf")
        self._lock = threading.Lock()
        self.problem: str | None = None
        """Why there is no key (None: there is one, or none was needed yet)."""

    def key(self) -> bytes | None:
        """The key (32+ bytes), or None when no source gives one (module docstring)."""
        if self._key is not None:
            return self._key
        with self._lock:
            now = self._clock()
            if self._key is None and now - self._tried >= RETRY_S:
                self._tried = now
                try:
                    self._key = self._load()
                    if self.problem is not None:
                        log.warning("tenant salt secret: usable again")
                    self.problem = None
                except Unusable as e:
                    if self.problem is None:
                        log.error("tenant salt secret: %s; requests with a tenant to backends "
                                  "that take a cache_salt are refused (424)", e)
                    self.problem = ("tenant salt secret unusable: requests with a tenant to "
                                    "salted backends are refused")
        return self._key

    def _load(self) -> bytes:
        if self._ref is not None:
            try:
                value = resolve_secret(self._ref) or ""
            except MissingSecret as e:
                raise Unusable(f"tenants.salt_secret: {e}") from None
            raw = value.encode("utf-8", "surrogateescape")
            if len(raw) < MIN_SECRET_BYTES:
                raise Unusable(f"tenants.salt_secret {self._ref} holds {len(raw)} bytes; at "
                               f"least {MIN_SECRET_BYTES} are required")
            return raw
        return _file_key(Path(self._path or DEFAULT_PATH).expanduser())

    def reasons(self) -> list[str]:
        """The ``/healthz`` reasons (empty: no problem known)."""
        return [self.problem] if self.problem else []

    def salt(self, tenant: str, client_salt: str | None = None) -> str:
        """The ``cache_salt`` of ``tenant`` (64 hex digits), the client's own folded in. Raises
        TenantSaltUnavailable when there is no key."""
        key = self.key()
        if key is None:
            raise TenantSaltUnavailable(
                "This proxy has no usable tenant salt secret, so a tenant's request cannot be "
                "kept in its own prefix-cache namespace on this backend; it was not sent. The "
                "proxy's log says what to fix.")
        return keyed_salt(key, tenant, client_salt)


def keyed_salt(key: bytes, tenant: str, client_salt: str | None = None) -> str:
    """``HMAC-SHA256(key, domain | tenant [| client | client_salt])`` as 64 hex digits."""
    msg = _DOMAIN + tenant.encode("utf-8", "surrogatepass")
    if client_salt:
        msg += b"|client|" + client_salt.encode("utf-8", "surrogatepass")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def _file_key(path: Path) -> bytes:
    """The key in ``path``, created when missing (module docstring). Raises Unusable."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tenant_salt.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:  # mkstemp: mode 0600
                f.write(secrets.token_bytes(_HEX_CHARS // 2).hex() + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic, and never over a file another process made
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        return _read_key(path)
    except FileNotFoundError:
        raise Unusable(f"secret file {path} vanished while being created") from None
    except OSError as e:
        raise Unusable(f"cannot create secret file {path}: {e.strerror or e}") from None


def _read_key(path: Path) -> bytes:
    """The 32 bytes in an existing secret file. FileNotFoundError when there is none; Unusable
    when it is not fit (module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise Unusable(f"cannot open secret file {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unusable(f"secret file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise Unusable(f"secret file {path} is owned by uid {st.st_uid}, not this user")
        if st.st_mode & 0o077:
            raise Unusable(f"secret file {path} has mode {oct(st.st_mode & 0o777)}; group and "
                           "others must have no access (chmod 600)")
        text = os.read(fd, _HEX_CHARS + 2).strip()
    except OSError as e:
        raise Unusable(f"cannot read secret file {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        if len(text) != _HEX_CHARS:
            raise ValueError
        return bytes.fromhex(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise Unusable(f"secret file {path} does not hold {_HEX_CHARS} hex digits") from None
