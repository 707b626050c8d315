"""P/D disaggregation: the prefill and decode roles of an engine, over one ``PDLink``.

``PrefillRole.export``: after a prefill request has run (its prompt KV is in the tree), lock the
part of it the decode side lacks (``kv_io.export_prefix``) and queue it for the sender
thread, which gathers it into the staging buffer, sends it and releases the lock. A transfer
that waits in the queue past ``timeout_s``, or meets a dead link, is released unsent.

``DecodeRole``: the receiver thread writes each transfer into the pool (staged on the engine
thread: pages reserved, K/V written ``import_chunk_tokens`` at a time between engine steps; one
bulk copy would stall every running decode for the whole transfer) and keeps it as a *pending
import* until its decode request ``claim``s it: only then do its pages enter the radix tree
(``finish_import``), locked for the request. A transfer nobody claims — ``timeout_s`` passes,
or the link dies — gives its pages back without ever entering the tree, so no other request
hits KV that no request of this instance asked for (issue 34). ``claim`` waits for a transfer
that has not arrived yet, up to its timeout; None means "recompute here" (vLLM's
``kv_load_failure_policy=recompute``).

Counters (``stats()``, vLLM's KV-connector terms): transfers and KV tokens moved, seconds spent
in send / receive + import, failures by reason, pending imports now.
"""

from __future__ import annotations

import functools
import logging
import queue
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefixgate.local_engine.kv.radix_cache import CacheHandle
from prefixgate.local_engine.pd.kv_io import (
    ImportedPrefix,
    ImportReservation,
    cancel_import,
    export_prefix,
    finish_import,
    gather_kv,
    release,
    reserve_import,
    write_import,
)
from prefixgate.local_engine.pd.link import LinkDead, PDLink, Received

__all__ = ["DecodeRole", "PendingImport", "PrefillRole", "TransferTicket"]

log = logging.getLogger("local_engine.pd")
MAX_FAILED_KEPT = 4096  # failed transfer ids remembered for their decode request (bounded)
MAX_DONE_KEPT = 65536  # claimed or expired transfer ids remembered: a replay is answered at once
IMPORT_CHUNK_TOKENS = 1024
"""Tokens of K/V an import writes into the pool between two engine steps. One piece of 1,024
tokens of SmolLM2-135M fp32 (45 MiB) copies in ~8 ms on the benchmark's CPU (4,000 tokens
imported in 27-42 ms, ``bench/results/pd_split.json``): a fifth of a decode step at most. Each
further piece delays the transfer's own request by one step (~50 ms there), so pieces are
large: 256-token pieces put 3 more steps (~200 ms) before a 1,024-token prompt's first token."""


class _EngineLike(Protocol):
    pool: Any
    cache: Any

    def call(self, fn: Any, paced: bool = False) -> Any: ...


@dataclass(frozen=True)
class TransferTicket:
    """What the prefill side answers: ``transfer_id`` (0: nothing to send), ``start`` (tokens
    the decode side already holds) and ``num_tokens`` (tokens whose KV is on its way)."""

    transfer_id: int
    start: int
    num_tokens: int


@dataclass
class PendingImport:
    """A received transfer waiting for its decode request (decode side): its K/V written into
    pages of ``reservation``, which enter the radix tree only when the request claims it
    (``finish_import``); or, when the tree already held the whole prompt, the locked match
    (``handle``). A claimed one always has ``handle`` (locked; ``unclaim`` drops it)."""

    transfer_id: int
    handle: CacheHandle | None
    new_tokens: int
    deadline: float
    claimed: bool = False
    reservation: ImportReservation | None = None


@dataclass
class _Stats:
    transfers: int = 0
    tokens: int = 0
    seconds: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)


def _release_on(engine: _EngineLike, handle: CacheHandle) -> None:
    """Drop a lock on the engine thread (fire and forget; a stopped engine drops it anyway)."""
    try:
        engine.call(lambda: release(engine.cache, handle))
    except RuntimeError:
        pass


def _drop(engine: _EngineLike, pending: PendingImport) -> None:
    """Give up a pending import on the engine thread (fire and forget): its reserved pages go
    back to the pool (they never entered the tree), or its lock is dropped."""
    res = pending.reservation
    if res is not None:
        try:
            engine.call(lambda: cancel_import(engine.pool, engine.cache, res))
        except RuntimeError:
            pass
    elif pending.handle is not None:
        _release_on(engine, pending.handle)


class PrefillRole:
    """Rank 0: sends the KV of finished prefills. ``start()`` pairs (blocking) and starts the
    sender thread."""

    def __init__(self, engine: _EngineLike, link: PDLink, timeout_s: float = 30.0) -> None:
        self.engine = engine
        self.link = link
        self.timeout_s = timeout_s
        self.stats_ = _Stats()
        self._jobs: queue.SimpleQueue[tuple[int, Any, bytes | None, float] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the link thread: it pairs with the decode instance, sends, and pairs again
        whenever the peer is lost (``_supervise``). Returns at once."""
        self._thread = threading.Thread(target=_supervise, name="pd-sender", daemon=True,
                                        args=(self.link, self._stop, self._send_loop))
        self._thread.start()

    def export(self, prompt: list[int], extra_key: bytes | None, start: int) -> TransferTicket:
        """Queue the KV of ``prompt`` from ``start`` on (blocking: waits for the engine
        thread's lock). Raises ``LinkDead`` when no decode instance is paired."""
        if self.link.dead or not self.link.ready.is_set():
            self.stats_.failures["link_down"] += 1
            raise LinkDead("no paired decode instance")
        cache = self.engine.cache
        if cache is None:
            raise LinkDead("prefix cache is off: no KV to export")
        exp = self.engine.call(lambda: export_prefix(cache, prompt, extra_key, start)).result()
        if exp is None:
            return TransferTicket(0, start - start % cache.page_size, 0)
        if exp.num_transfer > self.link.layout.buffer_tokens:
            _release_on(self.engine, exp.handle)
            self.stats_.failures["too_long"] += 1
            raise ValueError(f"{exp.num_transfer} tokens exceed the link's "
                             f"{self.link.layout.buffer_tokens}-token buffer")
        tid = secrets.randbits(62) + 1
        self._jobs.put((tid, exp, extra_key, time.monotonic() + self.timeout_s))
        return TransferTicket(tid, exp.start, exp.num_transfer)

    def _send_loop(self) -> None:
        """Send queued transfers until ``stop`` or the peer is lost (then return: the link
        thread pairs again)."""
        while not self.link.dead:
            try:
                job = self._jobs.get(timeout=max(0.05, self.link.timeout_s / 3))
            except queue.Empty:  # idle: a heartbeat keeps the decode side's receive alive
                try:
                    self.link.ping()
                except LinkDead:
                    self.stats_.failures["link_down"] += 1
                continue
            if job is None:
                return
            tid, exp, salt, deadline = job
            try:
                if time.monotonic() > deadline:
                    self.stats_.failures["timeout"] += 1
                    continue
                if self.link.dead:
                    self.stats_.failures["link_down"] += 1
                    continue
                t0 = time.perf_counter()
                self.link.send(tid, exp.start, exp.tokens, salt,
                               lambda view, e=exp: gather_kv(self.engine.pool, e.slots, view))
                self.stats_.seconds += time.perf_counter() - t0
                self.stats_.transfers += 1
                self.stats_.tokens += exp.num_transfer
            except LinkDead:
                self.stats_.failures["link_down"] += 1
            except Exception:
                log.exception("P/D send of transfer %d failed", tid)
                self.stats_.failures["error"] += 1
            finally:
                _release_on(self.engine, exp.handle)

    def stop(self) -> None:
        """Stop the sender (queued transfers are released) and close the link."""
        self._stop.set()
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                _release_on(self.engine, job[1].handle)
        self.link.close()

    def stats(self) -> dict[str, Any]:
        """Counters (module docstring), keyed ``kv_transfer_*``."""
        return _stats_dict(self.stats_, pending=0, up=_up(self.link), link=self.link)


class DecodeRole:
    """Rank 1: receives and imports transfers; ``claim`` hands one to its decode request."""

    def __init__(self, engine: _EngineLike, link: PDLink, timeout_s: float = 30.0,
                 import_chunk_tokens: int = IMPORT_CHUNK_TOKENS) -> None:
        if import_chunk_tokens < 1:
            raise ValueError("import_chunk_tokens must be >= 1")
        self.engine = engine
        self.link = link
        self.timeout_s = timeout_s
        self.import_chunk_tokens = import_chunk_tokens
        self.stats_ = _Stats()
        self._pending: dict[int, PendingImport] = {}
        self._failed: set[int] = set()
        self._done: OrderedDict[int, None] = OrderedDict()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the link thread: it pairs with the prefill instance, receives, and pairs again
        whenever the peer is lost (``_supervise``). Returns at once."""
        def receive() -> None:
            self.link.receive_forever(self.on_transfer, self.on_dead)

        self._thread = threading.Thread(target=_supervise, name="pd-receiver", daemon=True,
                                        args=(self.link, self._stop, receive))
        self._thread.start()

    # -- the receiver thread -------------------------------------------------------------------
    def on_transfer(self, got: Received) -> None:
        """Import one received transfer and hold it for its decode request until the timeout.

        The import is staged (``kv_io.reserve_import`` / ``write_import`` /
        ``finish_import``, each on the engine thread): at most ``import_chunk_tokens`` tokens of
        K/V are written between two engine steps, so the decodes running here stall for one
        chunk's copy, not the whole transfer's. Returns once the staging buffer is no longer
        read (the next receive reuses it)."""
        t0 = time.perf_counter()
        try:
            imp = self._import(got)
        except Exception:  # its decode request recomputes (the id is remembered as failed)
            log.exception("P/D import of transfer %d failed", got.transfer_id)
            imp = ImportedPrefix(None, 0, "error")
        self.stats_.seconds += time.perf_counter() - t0
        if isinstance(imp, ImportReservation):  # written; enters the tree when claimed
            self._hold(got, PendingImport(got.transfer_id, None, imp.num_new,
                                          time.monotonic() + self.timeout_s, reservation=imp))
            return
        if imp.handle is None:
            self.stats_.failures[imp.reason or "error"] += 1
            with self._cond:
                if len(self._failed) >= MAX_FAILED_KEPT:  # nobody asked for those: forget them
                    self._failed.clear()
                self._failed.add(got.transfer_id)
                self._cond.notify_all()
            return
        self._hold(got, PendingImport(got.transfer_id, imp.handle, imp.new_tokens,
                                      time.monotonic() + self.timeout_s))

    def _hold(self, got: Received, pend: PendingImport) -> None:
        """Keep ``pend`` for its decode request until the timeout (``expire``)."""
        self.stats_.transfers += 1
        self.stats_.tokens += len(got.tokens) - got.start
        with self._cond:
            self._pending[got.transfer_id] = pend
            self._cond.notify_all()
        timer = threading.Timer(self.timeout_s, self.expire, args=(got.transfer_id,))
        timer.daemon = True
        timer.start()

    def _import(self, got: Received) -> ImportedPrefix | ImportReservation:
        """The staged import of ``got`` (``on_transfer``): the reservation with every piece
        written — not in the tree yet: it enters at its claim (issue 34: a transfer nobody
        claims never becomes a prefix other requests hit) — or the ``ImportedPrefix`` when
        there was nothing to write (or no room, or a gap). The first piece runs before the
        next step, the others are paced engine calls (``Engine.call(paced=True)``: one after
        each step while requests run); a piece that fails gives the reserved pages back once
        every piece has run."""
        eng, pool, cache = self.engine, self.engine.pool, self.engine.cache
        n_kv = int(got.kv.shape[2])
        res = eng.call(lambda: reserve_import(pool, cache, got.tokens, got.extra_key, got.start,
                                              n_kv)).result()
        if not isinstance(res, ImportReservation):
            return res
        step = self.import_chunk_tokens
        pieces = [eng.call(functools.partial(write_import, pool, res, got.kv, lo,
                                             min(lo + step, res.num_new)), paced=lo > 0)
                  for lo in range(0, res.num_new, step)]  # the first at once, then one a step
        failed: BaseException | None = None
        for piece in pieces:  # every one, so none still writes into pages given back below
            try:
                piece.result()
            except BaseException as exc:  # a piece's own failure, or cancelled at shutdown
                failed = failed or exc
        if failed is not None:
            try:
                eng.call(lambda: cancel_import(pool, cache, res))
            except RuntimeError:  # the engine stopped: its pool goes with it
                pass
            raise failed
        return res

    def _finish(self, pending: PendingImport) -> PendingImport | None:
        """Insert a claimed import's pages into the tree and lock the prefix (engine thread);
        None (its pages given back) when that fails."""
        res = pending.reservation
        if res is None:
            return pending
        eng = self.engine
        try:
            imp = eng.call(lambda: finish_import(eng.pool, eng.cache, res)).result()
        except BaseException:
            log.exception("P/D import of transfer %d could not enter the tree",
                          pending.transfer_id)
            self.stats_.failures["error"] += 1
            _drop(eng, pending)
            return None
        pending.reservation, pending.handle, pending.new_tokens = None, imp.handle, imp.new_tokens
        return pending

    def on_dead(self) -> None:
        """The link is gone: wake every waiter, release every unclaimed import."""
        with self._cond:
            left = [p for p in self._pending.values() if not p.claimed]
            self._pending.clear()
            self._cond.notify_all()
        for p in left:
            self.stats_.failures["link_down"] += 1
            _drop(self.engine, p)

    def expire(self, transfer_id: int) -> bool:
        """Release an import nobody claimed in time; returns whether it did."""
        with self._cond:
            p = self._pending.get(transfer_id)
            if p is None or p.claimed:
                return False
            del self._pending[transfer_id]
            self._remember_done(transfer_id)
        self.stats_.failures["timeout"] += 1
        _drop(self.engine, p)
        return True

    # -- the decode request --------------------------------------------------------------------
    def claim(self, transfer_id: int, timeout_s: float | None = None) -> PendingImport | None:
        """The import of ``transfer_id``, waiting up to ``timeout_s`` (default the role's) for
        it to arrive; None when it failed, timed out or the link is down (recompute). A
        transfer already claimed or expired (a replayed id), or any claim while the link is
        not paired, is answered at once: only a transfer still on its way is waited for (the
        caller checks the ticket's tag first, ``pd.auth``). The caller must ``unclaim`` it once
        its request is admitted (or gone)."""
        end = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._cond:
            while True:
                p = self._pending.get(transfer_id)
                if p is not None:
                    p.claimed = True
                    del self._pending[transfer_id]
                    self._remember_done(transfer_id)
                    break
                if transfer_id in self._failed:
                    self._failed.discard(transfer_id)
                    self._remember_done(transfer_id)
                    return None
                if transfer_id in self._done:
                    self.stats_.failures["replayed"] += 1
                    return None
                left = end - time.monotonic()
                if self.link.dead or not self.link.ready.is_set():
                    self.stats_.failures["link_down"] += 1
                    return None
                if left <= 0:
                    self.stats_.failures["not_arrived"] += 1
                    self._remember_done(transfer_id)
                    return None
                self._cond.wait(min(left, 0.5))
        return self._finish(p)

    def _remember_done(self, transfer_id: int) -> None:
        """Keep ``transfer_id`` as claimed / given up (bounded; the oldest forgotten first).
        Call with ``_cond`` held."""
        self._done[transfer_id] = None
        while len(self._done) > MAX_DONE_KEPT:
            self._done.popitem(last=False)

    def unclaim(self, pending: PendingImport) -> None:
        """Drop a claimed import's lock (its request now holds its own, or is gone)."""
        _drop(self.engine, pending)

    def pending_count(self) -> int:
        """Imports waiting for their decode request now."""
        with self._cond:
            return len(self._pending)

    def stop(self) -> None:
        """Release every unclaimed import (the receiver ends with the link)."""
        self._stop.set()
        self.link.dead = True
        self.on_dead()

    def stats(self) -> dict[str, Any]:
        """Counters (module docstring), keyed ``kv_transfer_*``."""
        return _stats_dict(self.stats_, pending=self.pending_count(), up=_up(self.link),
                           link=self.link)


REPAIR_WAIT_S = 1.0
"""Seconds between two pairing attempts (a peer restarting, a refused peer, no peer yet)."""


def _supervise(link: PDLink, stop: threading.Event, session: Callable[[], None]) -> None:
    """The link thread of a role: pair, run ``session`` (send or receive until the peer is
    lost), tear the group down, and pair again (issue 34, item 9: a restarted decode instance
    pairs with the running prefill one) until ``stop``. Refused pairings (``pd.auth``: a peer
    without the secret, a second rank) are logged and counted on the link; each pairing after
    the first is a re-pair (``kv_link_repairs_total``)."""
    while not stop.is_set():
        try:
            link.start()
        except LinkDead as exc:
            if exc.reason != "rendezvous":  # no peer yet is no news; the others are
                log.error("P/D link not paired: %s", exc)
            stop.wait(REPAIR_WAIT_S)
            continue
        if link.dead or not link.ready.is_set():
            stop.wait(REPAIR_WAIT_S)
            continue
        try:
            session()
        except Exception:
            log.exception("P/D link session failed")
        if stop.is_set():
            return
        log.warning("P/D link lost (%s side); pairing again", getattr(link, "role", "?"))
        reset = getattr(link, "reset", None)
        if reset is not None:
            reset()
        stop.wait(REPAIR_WAIT_S / 4)


def _up(link: PDLink) -> int:
    return int(link.ready.is_set() and not link.dead)


def _stats_dict(st: _Stats, pending: int, up: int, link: PDLink | None = None) -> dict[str, Any]:
    pairings = int(getattr(link, "pairings", 0) or 0)
    out: dict[str, Any] = {
        "kv_link_up": up,
        "kv_link_pairings_total": pairings,
        "kv_link_repairs_total": max(0, pairings - 1),
        "kv_transfers_total": st.transfers,
        "kv_transfer_tokens_total": st.tokens,
        "kv_transfer_seconds_total": round(st.seconds, 6),
        "kv_transfer_pending": pending,
    }
    for reason, n in st.failures.items():
        out[f"kv_transfer_failures_total:{reason}"] = n
    for reason, n in (getattr(link, "refused", None) or {}).items():
        out[f"kv_link_pairing_failures_total:{reason}"] = n
    return out
