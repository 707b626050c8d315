"""Give a large request's freed memory back to the system (glibc's allocator; issue 34 item 17).

A 1 MB prompt passes through buffers of its size (the body, its parse, the upstream bytes, the
analysis's canonical texts) that are freed when the request ends — yet the process kept ~3 MB of
resident memory per such session. glibc's ``malloc`` serves a block of 128 KiB or more with its
own ``mmap`` (unmapped when freed) only until the first such block is freed: from then on its
*dynamic* threshold rises to that block's size and later megabyte buffers come from the heap,
whose freed pages stay resident (``mallopt(3)``, ``M_MMAP_THRESHOLD``). So:

- :func:`configure` (once, when ``prefixgate serve`` starts a proxy process) fixes the
  threshold at :data:`MMAP_THRESHOLD` (256 KiB), which turns the dynamic rise off;
- :func:`trim_soon` (after a request whose body was :data:`LARGE_BYTES` or more) asks glibc to
  return the heap's free pages (``malloc_trim(0)``), in a thread of its own, once the request's
  objects are gone, at most once per :data:`TRIM_EVERY_S`.

Both do nothing where the C library has no such calls (musl, macOS). ``bench/memory_loop.py``
(``session_mb_per_session``) measures the effect.

And once, when a serve process's app has started (its lifespan, ``app.state.freeze_startup``
set by ``prefixgate serve``) and before it takes its first request, :func:`freeze_startup`
collects and then freezes what is alive (modules, tables, the app: ~80 k objects), so no later full collection
walks them again (~50 ms less per full collection on the loaded 2-core box). Nothing of a
request exists yet, so no request's garbage is frozen — the per-request freeze of issue 34 item 4
froze pending cyclic garbage and stranded it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from typing import Any

log = logging.getLogger("prefixgate.heap")

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD = 256 << 10
LARGE_BYTES = 1 << 20
TRIM_EVERY_S = 1.0
TRIM_DELAY_S = 0.5
"""Seconds after a large request's end before trimming (its after-answer objects gone)."""


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if lib is None or not hasattr(lib, "mallopt") or not hasattr(lib, "malloc_trim"):
        return None
    return lib


_LIBC = _libc()
_last_trim = 0.0
_pending_since: float | None = None
"""When the trim now scheduled was asked for (None: none is); one older than
:data:`PENDING_LOST_S` is taken as lost (its loop ended first) and no longer blocks the next."""
PENDING_LOST_S = 10.0


def configure() -> bool:
    """Fix glibc's mmap threshold (module docstring); False where that is not possible."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def freeze_startup() -> int:
    """Collect, then freeze every object alive now out of the cycle collector's sight for good
    (:func:`gc.freeze`); call once, after the app is built and before it serves (module
    docstring). Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def trim() -> bool:
    """``malloc_trim(0)`` now (blocking; ctypes releases the GIL during it). True when memory
    was returned."""
    global _last_trim
    _last_trim = time.monotonic()
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


def trim_soon(body_bytes: int) -> None:
    """After a request of ``body_bytes``: schedule one :func:`trim` on the running loop's
    executor in :data:`TRIM_DELAY_S` when the body was large, none is pending and none ran in
    the last :data:`TRIM_EVERY_S`. Never raises."""
    global _pending_since
    if _LIBC is None or body_bytes < LARGE_BYTES:
        return
    now = time.monotonic()
    if now - _last_trim < TRIM_EVERY_S or (
            _pending_since is not None and now - _pending_since < PENDING_LOST_S):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _pending_since = now

    def run() -> None:
        global _pending_since
        try:
            trim()
        except Exception:  # a trim must never fail anything
            log.exception("malloc_trim failed")
        finally:
            _pending_since = None

    loop.call_later(TRIM_DELAY_S, lambda: threading.Thread(target=run, name="heap-trim",
                                                         daemon=True).start())
