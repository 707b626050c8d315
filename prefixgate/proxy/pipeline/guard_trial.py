"""The meaning guard's trials: a guarded move is tried on the route's own backend, off the
client's path, before it is turned on for that route (issue 36).

:class:`MeaningGuard` is built once per app (``ProxyState.meaning_guard``) over the proxy's
shared state (:class:`~prefixgate.cache.state.shared_state.LocalState`, or Redis when
``ledger.redis_url`` is set: verdicts and budgets are then the fleet's). After a client's
request has been answered and its row recorded (:func:`prefixgate.proxy.pipeline.record.finish`
calls :meth:`MeaningGuard.after`), for a request whose rewrite ran:

1. the moves whose policy mode is ``guarded`` and whose verdict for (route, tenant) is
   ``trialling`` (:class:`prefixgate.cache.guard.verdicts.GuardBook`), in
   :data:`MOVES` order; at most one trial per request;
2. "original" is the request's own rewrite (``Exchange.rw``: the move was off, it is
   trialling); "variant" the pass body rewritten again with the request's settings and
   session-memory view (``Exchange.ctx``) and the move forced on; both encoded by the primary
   bridge as the proxy encodes them; equal bytes: the move did not apply, no trial (in the
   background; with several moves trialling, one rewrite with all of them forced on first,
   :meth:`MeaningGuard._any_applies`: a request none changes costs one rewrite, not one per
   move). These rewrites run in the trials' own threads, never a client's. Their memory
   updates are dropped but the move's own (:meth:`MeaningGuard._learn`: a move off on the
   client's requests never learns, and ``hoist_volatile`` needs to have seen a line change);
3. sampled: one in ``sample_every`` of the requests the move changes, per (route, tenant, move);
4. the day's budget (:class:`prefixgate.cache.guard.budget.BudgetBook`) reserves 3 requests,
   ``3 x (body bytes + max_tokens + 64)`` tokens (bytes bound tokens from above) and the price
   table's USD for them (:func:`trial_usd`): the local budget for a self-hosted backend with no
   price, else the hosted budget (zero by default: no trials until the user sets one); a
   route's ``meaning_guard_budget`` overrides either. No reservation, no send;
5. three NON-streamed sends to the route's primary target through the same upstream client,
   URL and headers as the proxy's sends (the backend's own key, never the client's), with
   ``temperature: 0``, the guard's ``max_tokens`` (Messages ``max_tokens``, Responses
   ``max_output_tokens``) and ``stream: false``: original, original again (the floor: the
   backend's own nondeterminism), variant. Each writes a ledger row with ``trial`` = the move
   (never prompt text; excluded from savings, :mod:`prefixgate.cache.savings.trial_cost`);
6. the answers' decisions (:func:`prefixgate.cache.guard.decisions.decision_of`) give one pair:
   ``add_pair(move_changed=changed(original, variant), floor_changed=changed(original,
   repeat))``; a pair with a failed send (an error status, a timeout, an answer that is not a
   JSON object) is not added (an error says nothing about meaning) and the trial sends nothing
   after it (a backend refusing with 429 is not sent more); nor one whose original answer
   decided nothing (an error body, an empty answer:
   :func:`prefixgate.cache.guard.decisions.decided`; counted as ``undecided``), whose repeat
   and variant are then not sent (there is nothing to compare them with); the budget is
   settled with the usage the backend reported (a failed send: its share of the estimate), the
   requests and tokens of the sends not made given back.

Bounded: at most ``concurrency`` trials at once per process — a request arriving while they
run is skipped, never queued; each send has :data:`SEND_TIMEOUT_S` (or the backend's total
timeout when shorter) for its whole answer (within it, the transport waits for the head, which
a non-streamed answer sends last, as long as a client's send: the backend's first-byte or idle
timeout, the longer), read up to :data:`ANSWER_MAX_BYTES`; every upstream
response is closed on every path; nothing raises into the request path and nothing reaches a
client. The trial tasks are kept in a set (not garbage collected mid-flight) and cancelled at
the app's shutdown (:meth:`MeaningGuard.close`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import orjson

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.backend_kinds import traits
from prefixgate.config.guard_settings import GuardSettings, TrialBudget, guarded_moves
from prefixgate.config.prices import PRICES, price_for
from prefixgate.config.schema import Backend, Policy, RewriteSettings
from prefixgate.proxy.bridges.base import Bridge
from prefixgate.proxy.core.bounded import clip_fields
from prefixgate.proxy.core.usage import Usage, usage_from_answer
from prefixgate.proxy.http.headers import upstream_headers
from prefixgate.proxy.http.tenants import salted_body
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.rewrite import (
    OVER_BUDGET,
    RewriteFn,
    RewriteOutcome,
    rewrite_off_loop,
)
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import read_at_most
from prefixgate.rewriter.types import Api, Context

log = logging.getLogger("prefixgate.guard")

SENDS = 3
"""Sends per trial: original, original again (the floor), variant."""
TOKEN_SLACK = 64
"""Tokens added per send to the upper-bound estimate (chat template, role markers)."""
SEND_TIMEOUT_S = 60.0
"""Longest one trial send may take, head to last byte (the backend's total timeout when
shorter)."""
ANSWER_MAX_BYTES = 1 << 20
"""A trial answer is read up to this many bytes (16 tokens of answer are far below it)."""
NOT_REWRITTEN = (OVER_BUDGET, "rewrite_failed", "unavailable", "off")
"""Edit summaries of a rewrite that did not run to its end: nothing to compare against."""
SAMPLE_KEYS_MAX = 10_000
"""(route, tenant, move) sampling counters kept at most (then forgotten: sampling restarts)."""


@dataclass(frozen=True)
class TrialJob:
    """What one trial needs of a finished request (a snapshot: the exchange is not kept)."""

    route: str
    tenant: str
    model: str
    session: str
    session_id: str
    endpoint: str
    body: dict[str, Any]
    raw: bytes
    view: dict[str, Any]
    pass_api: Api
    bridge: Bridge
    target: Target
    ctx: Context
    sent: RewriteOutcome
    stood_back: tuple[str, ...]
    salted: bool
    max_depth: int


@dataclass(frozen=True)
class Sent:
    """One trial send's outcome: ``decision`` (None: the send failed), the tokens and USD it
    used (reported, else its share of the estimate)."""

    decision: str | None
    tokens: int
    usd: float


VERDICT_FIELDS = ("state", "pairs", "move_rate", "floor_rate", "expires_at")
"""What a trial row's ``edits`` keeps of the move's verdict (no text of any prompt)."""


def verdict_json(verdict: Any) -> str:
    """A verdict (``MoveVerdict``) as the JSON a trial row's ``edits`` holds
    (:data:`VERDICT_FIELDS`), read back by ``prefixgate report --guard``; "" for None."""
    if verdict is None:
        return ""
    return orjson.dumps({f: getattr(verdict, f) for f in VERDICT_FIELDS}).decode()


def forced(settings: RewriteSettings, move: str, on: bool) -> RewriteSettings:
    """``settings`` with ``move`` switched on or off for one rewrite (a bool: the config's
    ``switch_on`` reads a bool switch as itself; no other switch changes)."""
    return settings.model_copy(update={move: on})


BACKGROUND_PRIORITY = 1
"""vLLM's ``priority`` field on a trial sent to prefixgate's own engine (backend kind ``local``):
the engine admits and prefills it only in steps with no client's request in it
(``local_engine.sched.scheduler``, "Priority"), so trials take its idle time. Other kinds do not
get it (vLLM refuses a non-zero priority unless started with ``--scheduling-policy priority``)."""
BACKGROUND_KINDS = frozenset({"local"})


TRIAL_DROPPED: dict[str, tuple[str, ...]] = {
    "openai": ("n", "best_of", "n_predict"),
    "anthropic": ("thinking", "top_p", "top_k"),
    "responses": ("background",),
}
"""Fields a trial send drops, by wire. Chat: it asks for ONE answer within the guard's cap (a
client's ``n: 64`` would make each send generate 64 answers the budget never reserved;
llama.cpp's ``n_predict`` outranks ``max_tokens`` there). Messages: Claude refuses extended
thinking beside a temperature or with ``budget_tokens`` not below ``max_tokens`` (1024 at
least), and ``temperature`` beside ``top_p`` on its recent models (400: every trial of the route
would fail); at temperature 0 sampling settings change nothing, and original and variant lose
the same fields. Responses: ``background: true`` is answered at once, queued and empty
(nothing to compare)."""


def trial_body(encoded: bytes, wire: str, max_tokens: int, background: bool = False) -> bytes:
    """The upstream bytes of a trial send: ``encoded`` (the bridge's bytes of the rewritten
    body) with ``temperature: 0``, the output cap ``max_tokens`` in the API's own field (Chat:
    each of ``max_tokens`` / ``max_completion_tokens`` the body has, ``max_tokens`` when it has
    neither — backends differ on which one they read; Messages: ``max_tokens``; Responses:
    ``max_output_tokens``), the wire's :data:`TRIAL_DROPPED` fields dropped, and ``stream:
    false`` (its ``stream_options`` dropped); ``background``: with :data:`BACKGROUND_PRIORITY`.
    Raises ValueError when ``encoded`` is not a JSON object."""
    body = orjson.loads(encoded)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    if wire == "responses":
        caps = ["max_output_tokens"]
    elif wire == "openai":
        caps = [f for f in ("max_tokens", "max_completion_tokens") if f in body] or ["max_tokens"]
    else:
        caps = ["max_tokens"]
    for f in (*TRIAL_DROPPED.get(wire, ()), "stream_options"):
        body.pop(f, None)
    body.update({"temperature": 0, **dict.fromkeys(caps, max_tokens), "stream": False})
    if background:
        body["priority"] = BACKGROUND_PRIORITY
    return orjson.dumps(body)


def self_hosted(backend: Backend, model: str) -> bool:
    """A backend whose trials run on the local budget: a self-hosted engine kind (prefix-cache
    rules ``radix``: ours, vLLM / SGLang, llama.cpp) with no price of its own and none in the
    table for ``model`` (or only the self-hosted 0)."""
    table = price_for(model)
    return (traits(backend.kind).cache_provider == "radix" and backend.price_per_mtok is None
            and (table is None or table == PRICES["local"]))


def trial_usd(backend: Backend, model: str, prompt_tokens: int,
              output_tokens: int) -> tuple[bool, float]:
    """``(priced, USD)`` of sends with ``prompt_tokens`` uncached prompt tokens and
    ``output_tokens`` output tokens: the dated table's prices for ``model`` (input + output),
    else the backend's own ``price_per_mtok`` (input only: it sets no output price); unpriced:
    ``(False, 0.0)``."""
    table = price_for(model)
    if table is not None and table != PRICES["local"]:
        return True, (prompt_tokens * table.input + output_tokens * table.output) / 1e6
    if backend.price_per_mtok is not None:
        return True, prompt_tokens * backend.price_per_mtok / 1e6
    return False, 0.0


def route_budget(settings: GuardSettings, policy: Policy, route: str, backend: Backend,
                 model: str) -> TrialBudget:
    """The day's trial budget of ``route``: the route's ``meaning_guard_budget`` when set, else
    the guard's (``settings``) local budget for a self-hosted unpriced backend
    (:func:`self_hosted`), else its hosted budget."""
    own = next((getattr(r, "meaning_guard_budget", None) for r in policy.routes
                if r.match == route), None)
    if own is not None:
        return own
    return settings.local_budget if self_hosted(backend, model) else settings.hosted_budget


def job_of(state: ProxyState, ex: Exchange) -> TrialJob | None:
    """The trial snapshot of a finished request, None when it cannot have one: not answered
    ``ok``, not rewritten (opted out, holdout, an endpoint without passes), no target."""
    if (ex.ctx is None or ex.rw is None or ex.pass_view is None or ex.primary_bridge is None
            or not ex.targets or ex.rw.summary in NOT_REWRITTEN):
        return None
    api = ex.primary_bridge.pass_api
    if api is None or not ex.endpoint.passes:
        return None
    primary = ex.targets[0]
    if ex.served is not None and ex.served.backend_name == primary.backend_name:
        primary = ex.served  # the deployment the proxy chose
    return TrialJob(route=primary.route, tenant=ex.row.tenant, model=ex.row.model,
                    session=ex.row.session, session_id=ex.session_id,
                    endpoint=ex.endpoint.path, body=ex.body,
                    raw=ex.raw, view=ex.pass_view, pass_api=api, bridge=ex.primary_bridge,
                    target=primary, ctx=ex.ctx, sent=ex.rw, salted=ex.endpoint.salted,
                    stood_back=tuple(ex.row.stood_back.partition(": ")[0].split(",")),
                    max_depth=state.policy.limits.max_json_depth)


class MeaningGuard:
    """The trial runner (module docstring). ``book``: the verdicts (``GuardBook``);
    ``budgets``: the daily budgets (``BudgetBook``); ``settings``: the policy's
    ``meaning_guard`` (``GuardSettings``); ``policy``: the policy (move modes, routes);
    ``rewrite_fn``: the rewriter's pipeline (the proxy's); ``send``: the proxy's upstream
    send (:meth:`prefixgate.proxy.upstream.client.Upstream.send`). ``decision_of`` /
    ``changed``: the core's comparison (injectable for tests)."""

    def __init__(self, book: Any, budgets: Any, settings: Any, policy: Policy,
                 rewrite_fn: RewriteFn | None, send: Any, *, decision_of: Any = None,
                 changed: Any = None) -> None:
        from prefixgate.cache.guard import decisions

        decision_of = decision_of or decisions.decision_of
        changed = changed or decisions.changed
        self.decided = decisions.decided
        self.book, self.budgets, self.settings, self.policy = book, budgets, settings, policy
        self.rewrite_fn, self.send = rewrite_fn, send
        self.decision_of, self.changed = decision_of, changed
        self.tasks: set[asyncio.Task[None]] = set()
        self._limiter: tuple[asyncio.AbstractEventLoop, anyio.CapacityLimiter] | None = None
        self.running = 0
        self.sampled: dict[tuple[str, str, str], int] = {}
        self.counts = {"trials": 0, "sends": 0, "busy": 0, "no_budget": 0, "not_applied": 0,
                       "failed": 0, "undecided": 0}
        self.moves = guarded_moves(policy.rewrite)

    def after(self, state: ProxyState, ex: Exchange) -> None:
        """Start a trial of ``ex`` in the background when it may have one (module docstring);
        returns at once, never raises."""
        try:
            if not self.settings.enabled or not self.moves or ex.row.status != "ok":
                return
            if self.running >= self.settings.concurrency:
                self.counts["busy"] += 1
                return
            job = job_of(state, ex)
            if job is None:
                return
            self.running += 1
            task = asyncio.get_running_loop().create_task(self._run(state, job))
            self.tasks.add(task)
            task.add_done_callback(self._done)
        except Exception:
            log.exception("meaning-guard trial not started")

    def _threads(self) -> anyio.CapacityLimiter:
        """The trials' own rewrite threads (``concurrency`` of them, made in the running loop):
        a trial never holds one of the clients'
        (:data:`prefixgate.proxy.pipeline.rewrite.REWRITE_THREADS`), whose wait counts against a
        client's rewrite budget."""
        loop = asyncio.get_running_loop()
        if self._limiter is None or self._limiter[0] is not loop:
            self._limiter = (loop, anyio.CapacityLimiter(int(self.settings.concurrency)))
        return self._limiter[1]

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.running -= 1

    async def drain(self) -> None:
        """Wait until every trial started so far has ended (tests, benchmarks)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the trials in flight and wait for them (the app's shutdown)."""
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, state: ProxyState, job: TrialJob) -> None:
        """At most one trial for ``job``: the first trialling move that changes its body and
        is sampled. Never raises (a cancellation ends it)."""
        try:
            verdicts = await self.book.verdicts(job.route, job.tenant, self.moves)
            trialling = [m for m in self.moves if (v := verdicts.get(m)) is not None
                         and v.state == "trialling" and m not in job.stood_back]
            if len(trialling) > 1 and not await self._any_applies(state, job, trialling):
                self.counts["not_applied"] += len(trialling)
                return
            for move in trialling:
                bodies = await self._bodies(state, job, move)
                if bodies is None:
                    self.counts["not_applied"] += 1
                    continue
                if self._sampled(job, move):
                    await self._trial(state, job, move, *bodies)
                return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("meaning-guard trial failed")

    async def _any_applies(self, state: ProxyState, job: TrialJob, moves: list[str]) -> bool:
        """Whether any of ``moves`` changes ``job``'s body: ONE rewrite with all of them forced
        on (what each learns is kept, as in :meth:`_bodies`). Most requests change under none
        of them (no clock, no passages, a small catalog), so they cost one background rewrite,
        not one per trialling move; where one applies, :meth:`_bodies` finds which."""
        ctx = job.ctx
        for move in moves:
            ctx = replace(ctx, settings=forced(ctx.settings, move, True))
        view_raw = job.raw if job.view is job.body else orjson.dumps(job.view)
        rw = await rewrite_off_loop(self.rewrite_fn, job.view, view_raw, job.pass_api, ctx,
                                    self._threads())
        if rw.summary in NOT_REWRITTEN:
            return False
        for move in moves:
            await self._learn(state, job, move, rw.edits)
        return rw.raw != job.sent.raw

    def _sampled(self, job: TrialJob, move: str) -> bool:
        """One in ``sample_every`` of the requests ``move`` changes, per (route, tenant, move),
        the first one included."""
        key = (job.route, job.tenant, move)
        if key not in self.sampled and len(self.sampled) >= SAMPLE_KEYS_MAX:
            self.sampled.clear()
        n = self.sampled.get(key, 0)
        self.sampled[key] = n + 1
        return n % max(1, int(self.settings.sample_every)) == 0

    async def _bodies(self, state: ProxyState, job: TrialJob,
                      move: str) -> tuple[bytes, bytes] | None:
        """(original, variant) trial bytes: the request's own rewrite (``move`` off: it is
        trialling) and the pass body rewritten again with ``move`` forced on (same settings
        otherwise, same session view; memory updates dropped but the move's own), each encoded
        by the primary bridge, salted as the request was, made a trial send
        (:func:`trial_body`). None when the two are equal (the move did not apply) or the
        rewrite did not finish."""
        view_raw = job.raw if job.view is job.body else orjson.dumps(job.view)
        ctx = replace(job.ctx, settings=forced(job.ctx.settings, move, True))
        rw = await rewrite_off_loop(self.rewrite_fn, job.view, view_raw, job.pass_api, ctx,
                                    self._threads())
        if rw.summary in NOT_REWRITTEN:
            return None
        await self._learn(state, job, move, rw.edits)
        if rw.raw == job.sent.raw:
            return None
        original = job.bridge.encode(job.body, job.raw, job.sent, job.target.model, job.max_depth)
        variant = job.bridge.encode(job.body, job.raw, rw, job.target.model, job.max_depth)
        if original == variant:
            return None
        return self._ready(state, job, original), self._ready(state, job, variant)

    @staticmethod
    async def _learn(state: ProxyState, job: TrialJob, move: str, edits: Sequence[Any]) -> None:
        """Keep what ``move`` itself learned of this request in the session's memory (its own
        ``Edit.memory`` keys only; every other update of the trial rewrites is dropped). A
        guarded move is off on the client's requests until it is proven, so it never runs there
        and never learns: ``hoist_volatile`` moves a line only once session memory has seen it
        change, and without this it could never apply, so never be trialled. No other pass
        reads these keys while the move is off. A failure is logged, never raised."""
        mem: dict[str, Any] = {}
        for e in edits:
            if e.pass_name == move and e.memory:
                mem.update(e.memory)
        if not mem:
            return
        try:
            await state.sessions.amerge(job.session_id, mem)
        except Exception:
            log.exception("trial memory merge failed")

    def _ready(self, state: ProxyState, job: TrialJob, encoded: bytes) -> bytes:
        """``encoded`` as a trial send: the tenant's ``cache_salt`` where the request had one
        (raises when it cannot be salted: never sent unsalted), then :func:`trial_body`."""
        if job.salted and job.bridge.wire == "openai" and state.salt_key is not None:
            encoded = salted_body(encoded, job.tenant, job.target.backend, state.salt_key)
        return trial_body(encoded, job.bridge.wire, int(self.settings.max_tokens),
                          job.target.backend.kind in BACKGROUND_KINDS)

    async def _trial(self, state: ProxyState, job: TrialJob, move: str, original: bytes,
                     variant: bytes) -> None:
        """Reserve, send original / original / variant, add the pair, settle (module
        docstring)."""
        cap = int(self.settings.max_tokens)
        longest = max(len(original), len(variant))
        tokens = SENDS * (longest + cap + TOKEN_SLACK)
        model = job.target.model or job.model
        priced, usd = trial_usd(job.target.backend, model, SENDS * (longest + TOKEN_SLACK),
                                SENDS * cap)
        budget = route_budget(self.settings, self.policy, job.route, job.target.backend, model)
        reservation = await self.budgets.reserve(job.route, budget, SENDS, tokens, usd, priced)
        if reservation is None:
            self.counts["no_budget"] += 1
            return
        self.counts["trials"] += 1
        sent: list[Sent] = []
        rows: list[LedgerRow] = []  # one per send begun, a cancelled one's too
        verdict: Any = None
        try:
            for body in (original, original, variant):
                sent.append(await self._send(job, move, body, tokens // SENDS, usd / SENDS,
                                             rows))
                if sent[-1].decision is None:  # failed: no pair; nothing more to a backend
                    break                       # that refuses (429) or is broken
                if len(sent) == 1 and not self.decided(sent[0].decision):
                    break                       # the original decided nothing: no pair either
            got = [x.decision for x in sent]
            if None in got:                     # a failed send ended it
                self.counts["failed"] += 1
            elif not self.decided(got[0]):      # the original decided nothing: it ended there
                self.counts["undecided"] += 1
            else:
                first, repeat, moved = got
                verdict = await self.book.add_pair(job.route, job.tenant, move,
                                                   self.changed(first, moved),
                                                   self.changed(first, repeat))
        finally:
            with anyio.CancelScope(shield=True):
                for row in rows:  # with the verdict the pair gave (report --guard)
                    self._record(state, row, verdict)
                used = sum(x.tokens for x in sent)  # sends not made give their share back
                spent = sum(x.usd for x in sent)    # (and their requests: ``len(rows)`` begun)
                await self.budgets.settle(reservation, min(used, tokens), min(spent, usd),
                                          len(rows))

    async def _send(self, job: TrialJob, move: str, body: bytes, est_tokens: int,
                    est_usd: float, rows: list[LedgerRow]) -> Sent:
        """One trial send; its ledger row is appended to ``rows`` before it starts (written by
        the caller, also when the send is cancelled). Never raises but a cancellation. The
        response is closed on every path."""
        t = job.target
        self.counts["sends"] += 1
        row = LedgerRow(endpoint=job.endpoint, route=job.route, backend=t.backend_name,
                        model=job.model, tenant=job.tenant, session=job.session, stream=False,
                        rewrite=True, trial=move, deployment=t.deployment_name, attempts=1,
                        status="cancelled", http_status=499)
        rows.append(row)
        started = time.perf_counter()
        decision: str | None = None
        usage = Usage()
        try:
            connect, first, idle, total = t.backend.timeouts_s()
            limit = SEND_TIMEOUT_S if total is None else min(SEND_TIMEOUT_S, total)
            headers = upstream_headers((), t.backend, t.api_key())
            async with asyncio.timeout(limit):  # not streamed: the head comes after the answer
                resp = await self.send(job.bridge.url(t.base_url), headers, body,
                                       max(first, idle, 1.0), connect_s=connect)
                try:
                    content = await read_at_most(resp, ANSWER_MAX_BYTES)
                finally:
                    with anyio.CancelScope(shield=True):
                        await resp.aclose()
            row.status, row.http_status = "ok", resp.status_code
            if resp.status_code >= 400:
                row.status, row.error = "upstream_error", f"upstream {resp.status_code}"
            else:
                answer = orjson.loads(content)
                if not isinstance(answer, dict):
                    raise ValueError("answer is not a JSON object")
                usage = usage_from_answer(answer, job.bridge.wire)
                decision = self.decision_of(answer, job.bridge.wire,
                                            int(self.settings.first_tokens))
        except Exception as e:  # unreachable, timed out, unreadable: a failed send
            row.status, row.http_status = type(e).__name__[:60], 502
            row.error = type(e).__name__
        row.total_ms = (time.perf_counter() - started) * 1000
        row.prompt_tokens, row.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        row.output_tokens = usage.output_tokens
        model = job.target.model or job.model
        price = price_for(model)
        if price is not None and price != PRICES["local"] and usage.prompt_tokens is not None:
            cached = min(usage.cached_tokens or 0, usage.prompt_tokens)
            row.input_usd = ((usage.prompt_tokens - cached) * price.input
                             + cached * price.cached_input) / 1e6
        if usage.prompt_tokens is None:
            return Sent(decision, est_tokens, est_usd)
        _, usd = trial_usd(t.backend, model, usage.prompt_tokens, usage.output_tokens or 0)
        return Sent(decision, usage.prompt_tokens + (usage.output_tokens or 0), usd)

    def _record(self, state: ProxyState, row: LedgerRow, verdict: Any) -> None:
        """Write a trial send's row straight to the ledger (not the client's metrics,
        stand-back or rate limits), its ``edits`` the move's verdict after this trial's pair as
        JSON (:func:`verdict_json`; "" without a pair). Never raises."""
        try:
            row.edits = verdict_json(verdict)
            clip_fields(row)
            state.ledger.write(row)
        except Exception:
            log.exception("trial row not written")

    def snapshot(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The verdicts this process has seen (``GuardBook.snapshot``), ``tenant``'s and its
        sub-tenants' only when given (None: all)."""
        try:
            got: Sequence[Mapping[str, Any]] = self.book.snapshot()
        except Exception:
            log.exception("guard snapshot failed")
            return []
        if tenant is None:
            return [dict(v) for v in got]
        return [dict(v) for v in got
                if v.get("tenant") == tenant or str(v.get("tenant", "")).startswith(tenant + "/")]

    def state_counts(self) -> dict[str, int]:
        """``{state: number of (route, tenant, move) verdicts}`` — no names (``/healthz``)."""
        out: dict[str, int] = {}
        for v in self.snapshot():
            s = str(v.get("state", ""))
            out[s] = out.get(s, 0) + 1
        return out


def meaning_guard_for(policy: Policy, shared: Any, rewrite_fn: RewriteFn | None,
                      send: Any) -> MeaningGuard | None:
    """The app's trial runner over ``shared`` (the proxy's SharedState: verdicts and budgets
    are the fleet's when it is Redis), None when the policy guards no move, the guard is
    disabled, or nothing rewrites."""
    settings = getattr(policy, "meaning_guard", None)
    if settings is None or not settings.enabled or rewrite_fn is None:
        return None
    if not guarded_moves(policy.rewrite):
        return None
    from prefixgate.cache.guard.budget import BudgetBook
    from prefixgate.cache.guard.sequential import TestRule
    from prefixgate.cache.guard.verdicts import GuardBook

    rule = TestRule(margin=settings.margin, confidence=settings.confidence,
                    look_every=settings.look_every, max_pairs=settings.max_pairs)
    return MeaningGuard(GuardBook(shared, rule, settings.verdict_ttl_s), BudgetBook(shared),
                        settings, policy, rewrite_fn, send)
