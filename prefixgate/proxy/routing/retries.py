"""Send with retries and fallbacks, before the first byte reaches the client (issue 10, item 3).

:class:`Sender` walks the request's steps — each target of
:func:`prefixgate.proxy.routing.router.plan_targets` (the route's backends, then its fallbacks), and within a
deployment group its deployments in the order :mod:`prefixgate.proxy.routing.balance` gives (the chosen one
first, the others by load). Each deployment is tried once while another step remains; the last
one of the plan up to ``retry.attempts`` times:

- retried on the same deployment after a backoff with full jitter: a connect error (last step
  only), and the statuses of ``retry.on_status`` (408, 429, 500, 502, 503, 504, 529) when the
  answer's ``retry-after`` (seconds or an HTTP date) is at most ``retry.max_retry_after_s`` (waited
  out), or when it is the last step; a longer ``retry-after`` ends this deployment's tries;
- the next deployment / backend at once: a reset or a timeout before the response head (the
  deployment may be overloaded or the request may have run: repeating it there would not help);
- answered as is: any other status (a 400 is the client's, not the deployment's).

Bounded (issue 20, class 6): every send after the request's first spends a token of its
backend's :class:`RetryBudget` (none left: the client gets the last answer, or the last error, at
once), and no wait or send starts past the backend's ``timeouts.total_s`` from the first send.
The budgets are per backend (:class:`RetryBudgets`, issue 34 item 7), as Envoy's
``retry_budget`` is per cluster: one route's failing backend spends its own budget, never the
retries and fallbacks of requests sent to other backends.

When the last step fails too, the client gets the last upstream answer (its status, body in its
API shape, ``retry-after``), or the last error (502 / 504). Nothing is retried once the answer
has started: the caller relays the response returned here.

Breakers (:mod:`prefixgate.proxy.routing.breaker`): a deployment whose breaker is open is skipped while
another deployment of its group can serve; when every deployment's is open they are all tried anyway
(Envoy's "panic threshold": better an attempt than a certain failure). Every send counts in the
:class:`Attempts` log that goes to the ledger (``attempts``, ``attempt_reasons``,
``deployment``).

Timeouts (``Backend.timeouts_s``): connect and idle go to the transport; a first-byte timeout
shorter than the transport's read timeout is enforced here; idle and total on the answer by the
relay.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from prefixgate.config.backend_kinds import traits
from prefixgate.config.routing import Deployment, RetrySettings
from prefixgate.proxy.bridges.base import Bridge
from prefixgate.proxy.core.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from prefixgate.proxy.routing.balance import Balancer, choose, rendezvous_order
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.routing.shared import SharedRouting
from prefixgate.proxy.routing.slots import with_id_slot
from prefixgate.proxy.upstream.client import discard

SendFn = Callable[..., Awaitable[httpx.Response]]


@dataclass
class Step:
    """One target ready to send: its bridge (which also says where on a deployment the request
    goes, ``Bridge.url``) and its upstream bytes. The interface between the pipeline's prepare
    step, which makes one per target, and :class:`Sender`, which tries them in order."""

    target: Target
    bridge: Bridge
    body: bytes


@dataclass
class Attempts:
    """Every send of one request: ``reasons`` holds ``<deployment>:<why>`` for each failed one
    (``status-503``, ``connect``, ``reset``, ``timeout``); ``count``: sends made;
    ``all_open``: every deployment of every step had its breaker open (tried anyway)."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)
    all_open: bool = False

    def failed(self, deployment: str, why: str) -> None:
        """Note a failed send."""
        self.reasons.append(f"{deployment}:{why}")


def failure_kind(e: ProxyError) -> str:
    """``connect`` (nothing reached the deployment), ``timeout`` or ``reset`` for a send that
    raised: read from the transport's exception kept as the error's context (any client whose
    connect errors are named ``*Connect*``: httpx, aiohttp, the OS's ConnectionRefusedError)."""
    ctx = e.__context__
    if ctx is not None and "connect" in type(ctx).__name__.lower():
        return "connect"
    return "timeout" if isinstance(e, UpstreamTimeout) else "reset"


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """``retry-after`` in seconds (delta-seconds or an HTTP date, RFC 9110 10.2.3); None when
    absent or unreadable."""
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def backoff_s(retry: int, settings: RetrySettings, rand: Callable[[], float]) -> float:
    """Full-jitter backoff before retry number ``retry`` (1 = the first retry)."""
    cap = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (retry - 1))
    return rand() * cap


class RetryBudget:
    """Retries as a share of live traffic, shared by every request to one backend.

    A token bucket: each request earns ``ratio`` tokens (at most ``burst`` kept); each send after
    a request's first spends one. So over time retries and fallback sends stay near ``ratio`` x
    requests, plus a burst of ``burst`` — the bound of Envoy's ``retry_budget``
    (``budget_percent``, default 20 %) and of gRPC's retry throttling (gRFC A6), which keep a
    failing backend from being hit by every client's every retry at once."""

    def __init__(self, ratio: float, burst: float) -> None:
        self.ratio, self.burst = ratio, burst
        self.tokens = burst

    def earn(self) -> None:
        """A new request arrived."""
        self.tokens = min(self.burst, self.tokens + self.ratio)

    def spend(self) -> bool:
        """Take a token for one more send; False (nothing taken) when none is left."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class RetryBudgets:
    """One :class:`RetryBudget` per backend, made on first use (``ratio`` / ``burst`` each).

    A request earns in, and spends from, the budget of its **primary** backend (the first step
    of its plan: the backend its route sends it to); its retries there and its fallbacks to other
    backends are paid from that budget. So the budget is per cluster as in Envoy (a route's
    cluster, with its fallbacks as an aggregate cluster's priorities): requests failing on one
    backend drain that backend's budget only, and a request of another route, sent to another
    backend, keeps its own retries and fallbacks (issue 34 item 7: 40 failing requests on one
    route had turned another tenant's fallback answers on another route into 503s). Bounded:
    the backends are the policy's."""

    def __init__(self, ratio: float, burst: float) -> None:
        self.ratio, self.burst = ratio, burst
        self._by: dict[str, RetryBudget] = {}

    def of(self, backend: str) -> RetryBudget:
        """``backend``'s budget (full, ``burst`` tokens, when first asked)."""
        b = self._by.get(backend)
        if b is None:
            b = self._by[backend] = RetryBudget(self.ratio, self.burst)
        return b


@dataclass
class Picked:
    """The step and deployment that answered, and the release of its in-flight count. Handed
    by :meth:`Sender.run` to the pipeline (``Exchange.picked``) before the response is returned;
    the pipeline calls ``release`` exactly once, when the request's row is written."""

    step: Step
    target: Target
    release: Callable[[], None]


class Sender:
    """Retries, fallbacks, breakers and deployment choice around ``send`` (the upstream client's
    ``send(url, headers, body, timeout_s, connect_s=...)``). ``sleep`` / ``rand`` are
    injectable for tests. ``match``: ``async (target, deployments, body) -> cached tokens per
    deployment`` for ``exact`` affinity (None: not asked). ``shared``: the replicas' shared
    breakers and loads (None: this process's only, no I/O)."""

    def __init__(self, send: SendFn, retry: RetrySettings, breakers: BreakerBoard,
                 balancer: Balancer,
                 match: Callable[[Target, list[Deployment], bytes], Awaitable[list[int]]]
                 | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rand: Callable[[], float] = random.random,
                 shared: SharedRouting | None = None, budget: RetryBudgets | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.send, self.retry, self.breakers, self.balancer = send, retry, breakers, balancer
        self.match, self.sleep, self.rand, self.shared = match, sleep, rand, shared
        self.budgets = budget if budget is not None else RetryBudgets(retry.budget_ratio,
                                                                      retry.budget_burst)
        self.clock = clock

    async def order(self, step: Step, key: str,
                    opened: list[bool] | None = None) -> list[tuple[Deployment, str]]:
        """The deployments of ``step``'s backend to try, in order, each with why it is there;
        ``opened`` gets whether every one's breaker was open."""
        backend, name = step.target.backend, step.target.backend_name
        deps = backend.group(name)
        if self.shared is not None and len(deps) > 1:
            await self.shared.refresh([d.name for d in deps])
        avail = [d for d in deps if self.breakers.get(d.name).available()]
        if opened is not None:
            opened.append(not avail)
        avail = avail or deps
        if len(avail) == 1:
            return [(avail[0], "single")]
        names = [d.name for d in avail]
        loads = self.balancer.loads(names)
        placed, new_key, matches = None, False, None
        if backend.affinity.mode in ("prefix", "exact"):  # a new key: its placement (balance.py)
            new_key = not self.balancer.known(key, backend.affinity)
            placed = self.balancer.place(key, names, backend.affinity)
        if backend.affinity.mode == "exact" and self.match is not None and not new_key:
            matches = await self.match(step.target, avail, step.body)
        c = choose(names, loads, key, backend.affinity, self.balancer.turn(name), matches,
                   placed, new_key)
        if c.why == "cache_match" and c.index != placed:
            self.balancer.follow(key, names[c.index])
        rank = {i: r for r, i in enumerate(rendezvous_order(key, names))}  # the key's own tie order
        rest = sorted((i for i in range(len(avail)) if i != c.index), key=lambda i: (loads[i], rank[i]))
        return [(avail[c.index], c.why)] + [(avail[i], "next") for i in rest]

    async def run(self, steps: list[Step], headers_for: Callable[[Target], Mapping[str, bytes]],
                  key: str, log: Attempts,
                  on_pick: Callable[[Picked], None]) -> httpx.Response:
        """Send until a deployment answers (see module docstring); ``on_pick`` learns which
        before the response is returned. Raises the last UpstreamUnavailable / UpstreamTimeout
        when no deployment answered."""
        opened: list[bool] = []
        plan = [(s, d, why) for s in steps for d, why in await self.order(s, key, opened)]
        log.all_open = bool(opened) and all(opened)
        last: ProxyError = UpstreamUnavailable("no deployment to send to")
        budget = self.budgets.of(plan[0][0].target.backend_name if plan else "")
        budget.earn()  # the primary backend's budget pays this request's extra sends
        total = plan[0][0].target.backend.timeouts_s()[3] if plan else None
        deadline = None if total is None else self.clock() + total
        sent, paid = 0, False  # paid: the next send's budget token is already taken
        for i, (step, dep, why) in enumerate(plan):
            final = i == len(plan) - 1
            target = step.target.on(dep)
            body = self._slotted(step, dep, key)
            breaker = self.breakers.get(dep.name)
            for n in range(self.retry.attempts):
                more_here = n + 1 < self.retry.attempts
                if sent and not paid and not self._affordable(budget, deadline, 0.0):
                    raise last
                sent, paid = sent + 1, False
                breaker.before_send()
                release = self.balancer.acquire(dep.name, why)
                log.count += 1
                try:
                    resp = await self._send_one(target, step.bridge.url(target.base_url), body,
                                               headers_for(target), deadline)
                except (UpstreamUnavailable, UpstreamTimeout) as e:
                    release()
                    kind = failure_kind(e)
                    was = breaker.state
                    breaker.failure(kind)
                    if self.shared is not None:
                        await self.shared.failed(dep.name, was)
                    log.failed(dep.name, kind)
                    last = e
                    if kind == "connect" and more_here and final:
                        pause = backoff_s(n + 1, self.retry, self.rand)
                        if not self._affordable(budget, deadline, pause):
                            raise last from None
                        paid = True
                        await self.sleep(pause)
                        continue
                    break
                except BaseException:
                    release()
                    breaker.abandoned()
                    raise
                if resp.status_code not in self.retry.on_status:
                    was = breaker.state
                    breaker.success()
                    if self.shared is not None:
                        self.shared.succeeded(dep.name, was)
                    on_pick(Picked(step, target, release))
                    return resp
                was = breaker.state
                breaker.failure(f"status-{resp.status_code}")
                if self.shared is not None:
                    await self.shared.failed(dep.name, was)
                log.failed(dep.name, f"status-{resp.status_code}")
                wait = retry_after_s(resp.headers)
                said = wait is not None and wait <= self.retry.max_retry_after_s
                retry_here = more_here and (said or (final and wait is None))
                pause = max(wait or 0.0, backoff_s(n + 1, self.retry, self.rand))
                go_on = retry_here or not final
                if go_on and not self._affordable(budget, deadline, pause if retry_here else 0.0):
                    go_on = False
                if not go_on:
                    on_pick(Picked(step, target, release))
                    return resp  # the last answer goes to the client as it is
                paid = True
                with anyio.CancelScope(shield=True):
                    await resp.aclose()
                release()
                if not retry_here:
                    break
                await self.sleep(pause)
        raise last

    def _slotted(self, step: Step, dep: Deployment, key: str) -> bytes:
        """``step``'s bytes, with the conversation's llama.cpp slot on a backend that pins
        slots (:mod:`prefixgate.proxy.routing.slots`)."""
        backend = step.target.backend
        if not traits(backend.kind).pins_slots:
            return step.body
        return with_id_slot(step.body, self.balancer.slots.slot_for(dep.name, key, backend.slots))

    def _affordable(self, budget: RetryBudget, deadline: float | None, pause: float) -> bool:
        """Whether one more send (after ``pause`` seconds) fits the total deadline and the retry
        ``budget``; spends the budget's token when it does."""
        if deadline is not None and self.clock() + pause >= deadline:
            return False
        return budget.spend()

    async def _send_one(self, target: Target, url: str, body: bytes,
                        headers: Mapping[str, bytes], deadline: float | None = None
                        ) -> httpx.Response:
        """One send; its wait for the response head is bounded by the first-byte timeout and by
        what is left of the request's total deadline."""
        connect, first, idle, _total = target.backend.timeouts_s()
        read = max(first, idle)
        if deadline is not None:
            first = max(0.001, min(first, deadline - self.clock()))
        if first >= read:  # the transport's read timeout bounds the head: no timer, no task
            return await self.send(url, headers, body, read, connect_s=connect)
        sending = asyncio.ensure_future(self.send(url, headers, body, read, connect_s=connect))
        try:
            done, _ = await asyncio.wait((sending,), timeout=first)
        except BaseException:
            await discard(sending)
            raise
        if not done:
            await discard(sending)
            raise UpstreamTimeout(f"upstream {target.deployment_name!r} sent no response head "
                                  f"within {first:g} s")
        return sending.result()
