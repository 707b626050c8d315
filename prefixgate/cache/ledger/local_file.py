"""Opening a local SQLite file the proxy needs to serve, without letting it stop the proxy
(issue 34, "a corrupt or uncreatable spool file stops serve from starting").

:func:`open_or_recover` opens the file with the caller's ``connect`` (which also checks its
shape), and when that fails:

- the file is not a usable database (SQLite says ``SQLITE_NOTADB`` / ``SQLITE_CORRUPT``, or
  ``connect`` raised :class:`NotOurs`): it is moved aside — renamed
  ``<name>.corrupt-<UTC time>-<pid>`` with its ``-wal`` / ``-shm``, logged with the new name so a
  person can still read it — and a new file is made in its place. Only when the file at the path
  is still the one that failed (its inode): another worker that moved it first is not undone.
- the path cannot be created or opened (a parent that is a file, no permission, a read-only
  disk): the store is opened in memory instead and the reason kept (``error``), logged as an
  error: the proxy serves, the rows live as long as the process.

Lock contention (``SQLITE_BUSY`` / ``SQLITE_LOCKED``: another worker migrating the same file) is
neither: it is raised, as before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("prefixgate.ledger")

CORRUPT = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
"""SQLite errors that mean "this file is not a usable database": moved aside."""
BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")


class NotOurs(sqlite3.DatabaseError):
    """A SQLite file whose tables are not the shape the caller expects (another program's)."""


@dataclass
class Opened:
    """What :func:`open_or_recover` opened: ``path`` (``":memory:"`` when degraded), ``db``,
    ``moved_aside`` (where an unusable file went, or None), ``error`` (why the store is in
    memory — the error's kind and message, never the path — or "")."""

    path: str
    db: sqlite3.Connection
    moved_aside: str | None = None
    error: str = ""


def open_or_recover(path: str, connect: Callable[[str], sqlite3.Connection],
                    what: str) -> Opened:
    """Open ``path`` (``~`` expanded, parent made) with ``connect``, recovering as the module
    docstring says; ``what`` names the store in the log ("ledger spool", "ledger")."""
    if path == ":memory:":
        return Opened(path, connect(path))
    fp = Path(path).expanduser()
    moved: str | None = None
    try:
        fp.parent.mkdir(parents=True, exist_ok=True)
        seen = _inode(fp)
        try:
            return Opened(str(fp), connect(str(fp)))
        except sqlite3.DatabaseError as e:
            if not isinstance(e, NotOurs) and getattr(e, "sqlite_errorname", "") not in CORRUPT:
                raise
            if _inode(fp) == seen:  # else another worker moved it and made a new one
                moved = _move_aside(fp, e, what)
            return Opened(str(fp), connect(str(fp)), moved)
    except (OSError, sqlite3.Error) as e:
        if getattr(e, "sqlite_errorname", "") in BUSY:
            raise
        # the reason without the path: /healthz is open, the log has the path
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        log.error("%s %s cannot be used (%s: %s): kept in memory instead (lost when this "
                  "process ends)", what, fp, type(e).__name__, e)
        return Opened(":memory:", connect(":memory:"), moved, f"{type(e).__name__}: {why}")


def _inode(fp: Path) -> int | None:
    try:
        return fp.stat().st_ino
    except OSError:
        return None


def _move_aside(fp: Path, why: BaseException, what: str) -> str:
    """Rename the unusable file ``fp`` (and its ``-wal`` / ``-shm``) to
    ``<name>.corrupt-<UTC time>-<pid>``; return the new name. Logged, with the reason."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = fp.with_name(f"{fp.name}.corrupt-{stamp}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        try:
            os.replace(str(fp) + suffix, str(dest) + suffix)
        except FileNotFoundError:  # no such side file, or another worker moved it first
            continue
    log.error("%s %s is not usable (%s: %s): moved aside to %s; a new one is made in its place",
              what, fp, type(why).__name__, why, dest)
    return str(dest)
