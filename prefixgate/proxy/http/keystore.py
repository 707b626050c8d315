"""The proxy's keys as the running proxy sees them, failing closed (issue 20 High 3).

:class:`KeyStore` holds the policy's inline ``auth.keys`` plus the ``auth.keys_file`` ones,
re-read when the file changes (its inode, size, mtime, ctime or mode; checked at most once a
second, :data:`RELOAD_EVERY_S`), so ``prefixgate keys add / remove`` apply without a restart.

Once keys are **required** — a key was ever loaded in this process, or the keys file could not
be read — they stay required until the process ends: no later state of the file opens the
proxy. What each state of the file means then:

====================================  ===================================================
the keys file                         the proxy
====================================  ===================================================
readable, with keys                   those keys (+ inline)
readable, no keys (emptied, or the    no key in the file is valid: only inline keys
last key removed); missing (deleted)  pass, every other request is 401
unreadable, not YAML / not the        the last keys read stay (what the file meant is not
keys shape, not a regular file (a     known; a file written by ``prefixgate keys`` is
FIFO would block), over 16 MiB        replaced atomically and is never seen half-written)
====================================  ===================================================

Each of the last two rows is a **problem**: logged once when it begins (``ERROR``, naming the
file) and once when it ends, and listed by :meth:`KeyStore.reasons` (``/healthz`` answers 503
with it; the reason does not name the file's path). At start, a missing or empty keys file with
no inline keys is not a problem: the proxy serves without keys, which ``prefixgate serve``
allows on a loopback address only.

Writers (:func:`locked`) hold an exclusive ``fcntl.flock`` on ``<keys file>.lock`` around their
read-modify-write; :func:`prefixgate.config.loader.save_keys_file` replaces the file atomically
(temp file + rename), so readers never take a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prefixgate.config.loader import PolicyError, load_keys_file
from prefixgate.config.schema import AuthSettings, ProxyKey

log = logging.getLogger("prefixgate.auth")

RELOAD_EVERY_S = 1.0
"""How often (s) the keys file is checked for a change."""
MAX_KEYS_FILE_BYTES = 16 << 20
"""A keys file larger than this is not read (~100,000 keys fit in 16 MiB)."""

Signature = tuple[int, ...] | None
_UNREAD: Signature = (-1,)


def hash_key(key: str) -> str:
    """What is stored for ``key``: ``sha256:`` + 64 hex digits of its UTF-8 bytes (why a fast
    hash suffices: :mod:`prefixgate.proxy.http.auth`)."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def _signature(path: str) -> Signature:
    """What identifies the file's current content: (device, inode, size, mtime ns, ctime ns,
    mode); None when it does not exist (or cannot be looked at)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return (-2,)  # the folder is unreadable: a problem, not "no file"
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


class Unusable(Exception):
    """A keys file that cannot be used: ``what`` (a category, safe to show anyone: no path, no
    content) and ``detail`` (for the log)."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what)
        self.what, self.detail = what, detail


def _read(path: str, sig: Signature) -> list[ProxyKey]:
    """The file's keys; Unusable when it cannot be used (see module docstring)."""
    if sig == (-2,):
        raise Unusable("cannot be looked at", "stat failed (permission denied?)")
    assert sig is not None
    if not stat.S_ISREG(sig[5]):
        raise Unusable("not a regular file", f"mode {oct(sig[5])}")
    if sig[2] > MAX_KEYS_FILE_BYTES:
        raise Unusable("too large", f"{sig[2]} bytes > {MAX_KEYS_FILE_BYTES}")
    try:
        return load_keys_file(path)
    except PolicyError as e:
        raise Unusable("cannot be read, or not YAML {keys: [...]}",
                       "; ".join(f"{w}: {m}" for w, m in e.problems)[:500]) from None


class KeyStore:
    """The policy's keys (module docstring). ``clock``: monotonic seconds (tests)."""

    def __init__(self, settings: AuthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._inline = list(settings.keys)
        self._file = settings.keys_file
        self._clock = clock
        self._file_keys: list[ProxyKey] = []
        self._sig: Signature = _UNREAD
        self._checked = float("-inf")
        self.required = bool(self._inline)
        """Whether every model request needs a key (sticky, see module docstring)."""
        self.problem: str | None = None
        """Why the keys file is not what the proxy serves from (None: no problem)."""
        self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        if self._file is None:
            return
        now = self._clock()
        if not force and now - self._checked < RELOAD_EVERY_S:
            return
        self._checked = now
        sig = _signature(self._file)
        if sig == self._sig:
            return
        self._sig = sig
        problem: str | None = None
        detail = ""
        if sig is None:
            keys: list[ProxyKey] = []
        else:
            try:
                keys = _read(self._file, sig)
            except Unusable as e:
                keys, detail = self._file_keys, e.detail
                problem = (f"keys file unreadable ({e.what}): serving the {len(keys)} key(s) "
                           "read before; every other request is refused (401)")
        if problem is not None:
            self.required = True  # unknown content: never open (module docstring)
        elif keys:
            self.required = True
        elif self.required:
            problem = ("keys file has no keys (emptied, removed or deleted): every model "
                       "request without an inline key is refused (401)")
        self._file_keys = keys
        self._set_problem(problem, detail)

    def _set_problem(self, problem: str | None, detail: str = "") -> None:
        if problem == self.problem:
            return
        if problem is not None:
            log.error("proxy keys (%s): %s%s", self._file, problem,
                      f" [{detail}]" if detail else "")
        else:
            log.warning("proxy keys (%s): the keys file is readable again, %d key(s)",
                        self._file, len(self._file_keys))
        self.problem = problem

    def keys(self) -> list[ProxyKey]:
        """Every key that admits a request now (inline first), after a reload check."""
        self._reload()
        return self._inline + self._file_keys

    @property
    def configured(self) -> bool:
        """Whether every model request needs a key (after a reload check)."""
        self._reload()
        return self.required

    def reasons(self) -> list[str]:
        """The keys' problem as ``/healthz`` reasons (empty: none), after a reload check."""
        self._reload()
        return [f"proxy keys: {self.problem}"] if self.problem else []

    def lookup(self, key: str) -> ProxyKey | None:
        """The stored key whose hash matches ``key``, or None. Constant time in the key: every
        stored hash is compared with :func:`hmac.compare_digest`, no early exit."""
        digest = hash_key(key).encode()
        found: ProxyKey | None = None
        for k in self.keys():
            if hmac.compare_digest(digest, k.hash.encode()):
                found = k
        return found


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """An exclusive ``fcntl.flock`` on ``<path>.lock`` (made with mode 0600 when absent and
    never deleted: deleting a lock file another writer holds open would let a third one in)
    for the block's duration. Blocks until the lock is free."""
    p = Path(path)
    lock = p.with_name(p.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
