"""Offline cache simulator: replay an agent trace through a rewrite strategy into a provider cache
model, in simulated time, with no network.

For each strategy the same schedule of requests is replayed (runs one after another per lane,
requests ``gap_s`` apart, seeded), each body built in the client's API, transformed by the
strategy, and fed to a fresh provider model (:mod:`prefixgate.cache.provider_models`), a
:class:`~prefixgate.cache.savings.breaks.BreakDetector` and the price table:

* ``none`` — the client's request as is (Anthropic: no ``cache_control``, so nothing is cached).
* ``positional`` — what other gateways do: a breakpoint on the system prompt and on the last
  message, nothing else changed (Anthropic); as is for OpenAI / radix.
* ``prefixgate`` — :func:`prefixgate.rewriter.pipeline.rewrite_request` with default ``RewriteSettings``
  and ``Context.provider`` set; each run is a session whose memory is merged from the edits. The
  moves ship ``guarded`` and the simulation has no meaning-guard verdict: they are off here (set
  them ``on`` in ``--policy`` to simulate a route where the guard turned them on).
* ``ttl-5m`` / ``ttl-1h`` / ``ttl-auto`` (:data:`TTL_STRATEGIES`, ``--strategy ttl``) —
  ``prefixgate`` with ``breakpoint_ttl`` fixed at 5m, fixed at 1h, or chosen by expected cost
  from the session's measured inter-arrival times (:mod:`prefixgate.rewriter.analysis.ttl_choice`).

* ``key-per-conversation`` / ``key-none`` / ``key-one-for-all`` (:data:`KEY_STRATEGIES`,
  ``--strategy key``) — ``prefixgate`` with ``openai_prompt_cache_key`` on (one key per run, the
  run being a conversation), off, and with the client sending one ``prompt_cache_key`` for every
  conversation (kept, as a client's key always is). Only the key differs; the OpenAI model routes
  by prefix + key and spills a pair above ~15 requests a minute to cold machines
  (:mod:`prefixgate.cache.provider_models.openai`), so this shows what the key is worth with many
  conversations in flight (``bench/prompt_cache_key.py``).

``think_time`` (:mod:`prefixgate.proxy.sim.think_time`) replaces the uniform ``gap_s`` between a run's
requests with a distribution (fixed, lognormal, or a human-in-the-loop mix keyed by whether the request
ends with a tool result or a user turn). Every strategy gets the simulated time as
``Context.now_s``.

``volatile_clock`` replaces the trace's fixed "The current time is 2024-05-15 15:00:00 EST." with
the simulated wall-clock time of each request (seconds resolution), as a live agent would send.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from prefixgate.cache.provider_models import CacheOutcome, make_model
from prefixgate.cache.provider_models.prefix_blocks import TokenCounter, flatten, memo_counter
from prefixgate.cache.savings.breaks import BreakDetector, BreakRecord, count_by_kind
from prefixgate.cache.savings.cost import Cost, price_outcome, price_without_cache
from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.sim.think_time import ThinkTime, message_kind
from prefixgate.proxy.sim.traces import SimRun, openai_body, output_text, to_anthropic
from prefixgate.proxy.sim.wall_clock import CLOCK_RE
from prefixgate.rewriter.analysis.tokens import count_tokens as default_counter
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context

STRATEGIES = ("none", "positional", "prefixgate")
TTL_STRATEGIES = ("ttl-5m", "ttl-1h", "ttl-auto")
KEY_STRATEGIES = ("key-per-conversation", "key-none", "key-one-for-all")
ONE_KEY = "one-key-for-all"
"""The ``prompt_cache_key`` the ``key-one-for-all`` client sends on every request."""
DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o", "radix": "local"}
TRACE_EPOCH = datetime(2024, 5, 15, 15, 0, 0)
MAX_EXAMPLES_PER_KIND = 3

Strategy = Callable[[dict[str, Any], str, "_RunState"], dict[str, Any]]


@dataclass(frozen=True)
class SimConfig:
    """Simulation knobs. ``gap_s``: (min, max) seconds between a run's requests; ``run_gap_s``:
    idle seconds between runs of a lane; ``concurrency``: lanes of runs in parallel;
    ``clock_resolution_s``: the volatile clock is floored to this many seconds (60 = a
    minute-resolution clock as in case B03)."""

    provider: str = "anthropic"
    model: str = ""
    strategies: tuple[str, ...] = STRATEGIES
    volatile_clock: bool = False
    seed: int = 0
    gap_s: tuple[float, float] = (10.0, 30.0)
    run_gap_s: tuple[float, float] = (10.0, 30.0)
    concurrency: int = 1
    clock_resolution_s: int = 1
    think_time: ThinkTime | None = None

    @property
    def api(self) -> str:
        """Client API: Anthropic Messages for the Anthropic provider, else OpenAI Chat."""
        return "anthropic" if self.provider == "anthropic" else "openai"

    @property
    def model_id(self) -> str:
        """The model id requests carry."""
        return self.model or DEFAULT_MODELS.get(self.provider, "gpt-4o")


@dataclass
class _RunState:
    run_id: str
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Totals:
    requests: int = 0
    input_tokens: int = 0
    cached_read_tokens: int = 0
    write_tokens: int = 0
    uncached_tokens: int = 0
    output_tokens: int = 0
    cost: Cost = field(default_factory=Cost)
    cost_no_cache: Cost = field(default_factory=Cost)
    breaks: list[BreakRecord] = field(default_factory=list)
    rewrite_errors: int = 0
    first_error: str = ""
    rewrite_s: float = 0.0

    def add(self, outcome: CacheOutcome, out_tokens: int, cost: Cost, no_cache: Cost) -> None:
        self.requests += 1
        self.input_tokens += outcome.input_tokens
        self.cached_read_tokens += outcome.cached_read_tokens
        self.write_tokens += outcome.cache_write_tokens
        self.uncached_tokens += outcome.uncached_tokens
        self.output_tokens += out_tokens
        self.cost = self.cost + cost
        self.cost_no_cache = self.cost_no_cache + no_cache

    def figures(self) -> dict[str, Any]:
        examples: dict[str, list[dict[str, Any]]] = {}
        for b in self.breaks:
            lst = examples.setdefault(b.kind, [])
            if len(lst) < MAX_EXAMPLES_PER_KIND:
                lst.append({k: v for k, v in b.to_dict().items()
                            if k not in ("excerpt_before", "excerpt_after")})
        share = self.cached_read_tokens / self.input_tokens if self.input_tokens else 0.0
        saving = 1 - self.cost.input_usd / self.cost_no_cache.input_usd \
            if self.cost_no_cache.input_usd else 0.0
        return {
            "requests": self.requests,
            "cached_share": round(share, 4),
            "input_tokens": self.input_tokens,
            "cached_read_tokens": self.cached_read_tokens,
            "write_tokens": self.write_tokens,
            "uncached_tokens": self.uncached_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": round(self.cost.total_usd, 4),
            "cost_no_cache_usd": round(self.cost_no_cache.total_usd, 4),
            "input_cost_usd": round(self.cost.input_usd, 4),
            "input_cost_no_cache_usd": round(self.cost_no_cache.input_usd, 4),
            "input_cost_saving": round(saving, 4),
            "breaks": count_by_kind(self.breaks),
            "tokens_lost_to_breaks": sum(b.tokens_lost for b in self.breaks),
            "break_examples": examples,
            "rewrite_errors": self.rewrite_errors,
            **({"first_rewrite_error": self.first_error} if self.first_error else {}),
            "rewrite_ms_per_request": round(1000 * self.rewrite_s / max(1, self.requests), 3),
        }


def schedule(runs: Sequence[SimRun], cfg: SimConfig) -> list[tuple[float, int, int]]:
    """``[(t_seconds, run_index, request_index)]`` sorted by time: runs are spread over
    ``cfg.concurrency`` lanes, each lane runs its runs back to back with ``run_gap_s`` between,
    a run's requests are ``gap_s`` apart (or ``think_time`` samples). Deterministic for a seed."""
    rng = random.Random(cfg.seed)
    lanes = [0.0] * max(1, cfg.concurrency)
    events: list[tuple[float, int, int]] = []
    for r, run in enumerate(runs):
        lane = r % len(lanes)
        t = lanes[lane] + (rng.uniform(*cfg.run_gap_s) if r >= len(lanes) else 0.0)
        for k in range(len(run.requests)):
            if k and cfg.think_time is not None:
                t += cfg.think_time.sample(rng, message_kind(run.requests[k].messages))
            elif k:
                t += rng.uniform(*cfg.gap_s)
            events.append((t, r, k))
        lanes[lane] = t
    events.sort()
    return events


def _with_clock(messages: list[dict[str, Any]], now_s: float,
                resolution_s: int = 1) -> list[dict[str, Any]]:
    shown = int(now_s) // max(1, resolution_s) * max(1, resolution_s)
    stamp = (TRACE_EPOCH + timedelta(seconds=shown)).strftime("%Y-%m-%d %H:%M:%S")
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") == "system" and isinstance(content, str) and CLOCK_RE.search(content):
            m = dict(m, content=CLOCK_RE.sub(f"The current time is {stamp} EST.", content))
        out.append(m)
    return out


def client_body(run: SimRun, k: int, now_s: float, cfg: SimConfig) -> dict[str, Any]:
    """Request ``k`` of ``run`` as the client sends it at ``now_s`` (client API of ``cfg``)."""
    messages = run.requests[k].messages
    if cfg.volatile_clock:
        messages = _with_clock(messages, now_s, cfg.clock_resolution_s)
    if cfg.api == "anthropic":
        return to_anthropic(cfg.model_id, run.tools, messages)
    return openai_body(cfg.model_id, run.tools, messages)


def positional(body: dict[str, Any], api: str) -> dict[str, Any]:
    """The usual gateway placement: ``cache_control`` on the system prompt and on the last
    content block of the last message (Anthropic); other APIs unchanged."""
    if api != "anthropic":
        return body
    out = dict(body)
    system = body.get("system")
    if isinstance(system, str) and system:
        out["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    elif isinstance(system, list) and system:
        out["system"] = [*system[:-1], {**system[-1], "cache_control": {"type": "ephemeral"}}]
    msgs = list(body.get("messages") or [])
    if msgs:
        last = dict(msgs[-1])
        content = last.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if content:
            last["content"] = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
        msgs[-1] = last
        out["messages"] = msgs
    return out


class Simulator:
    """Replays runs for one provider; :meth:`run` returns the ``--json`` figures."""

    def __init__(self, cfg: SimConfig, count_tokens: TokenCounter | None = None,
                 settings: RewriteSettings | None = None) -> None:
        self.cfg = cfg
        self.count = memo_counter(count_tokens or default_counter)
        self.settings = settings or RewriteSettings.model_validate({})

    def _apply(self, strategy: str, body: dict[str, Any], state: _RunState,
               totals: _Totals, now_s: float = 0.0) -> dict[str, Any]:
        if strategy == "none":
            return body
        if strategy == "positional":
            return positional(body, self.cfg.api)
        if strategy == "prefixgate" or strategy in TTL_STRATEGIES + KEY_STRATEGIES:
            settings = self.settings
            if strategy in TTL_STRATEGIES:
                settings = settings.model_copy(
                    update={"breakpoint_ttl": strategy.removeprefix("ttl-")})
            elif strategy in KEY_STRATEGIES:
                settings = settings.model_copy(
                    update={"openai_prompt_cache_key": strategy == "key-per-conversation"})
                if strategy == "key-one-for-all":
                    body = {**body, "prompt_cache_key": ONE_KEY}
            ctx = Context(settings=settings, model=self.cfg.model_id,
                          provider=self.cfg.provider, session_id=state.run_id,
                          session=MappingProxyType(dict(state.memory)), count_tokens=self.count,
                          now_s=now_s)
            t0 = time.perf_counter()
            try:
                result = rewrite_request(body, self.cfg.api, ctx)  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - a broken rewriter must show in the figures
                totals.rewrite_errors += 1
                totals.first_error = totals.first_error or f"{type(e).__name__}: {e}"[:300]
                return body
            finally:
                totals.rewrite_s += time.perf_counter() - t0
            state.memory.update(session_updates(result))
            return result.body
        raise ValueError(f"unknown strategy {strategy!r}; expected one of "
                         f"{STRATEGIES + TTL_STRATEGIES + KEY_STRATEGIES}")

    def run_strategy(self, runs: Sequence[SimRun], strategy: str,
                     events: list[tuple[float, int, int]]) -> _Totals:
        """Replay ``events`` under ``strategy`` with a fresh cache model and break detector."""
        model = make_model(self.cfg.provider, self.count)
        detector = BreakDetector()
        states = [_RunState(r.run_id) for r in runs]
        totals = _Totals()
        for t, r, k in events:
            run = runs[r]
            wire = self._apply(strategy, client_body(run, k, t, self.cfg), states[r], totals, t)
            blocks = flatten(wire, self.cfg.api, self.count)  # type: ignore[arg-type]
            outcome = model.process(wire, t, blocks)
            out_tokens = self.count(output_text(run.requests[k].output))
            totals.add(outcome, out_tokens,
                       price_outcome(outcome, self.cfg.model_id, out_tokens),
                       price_without_cache(outcome.input_tokens, self.cfg.model_id, out_tokens))
            rec = detector.observe(run.run_id, wire, self.count, blocks=blocks)
            if rec is not None:
                totals.breaks.append(rec)
        return totals

    def run(self, runs: Sequence[SimRun]) -> dict[str, Any]:
        """Figures for every configured strategy: ``{"provider", "model", "runs", "requests",
        "volatile_clock", "seconds", "strategies": {name: {...}}}``."""
        t0 = time.perf_counter()
        events = schedule(runs, self.cfg)
        strategies = {s: self.run_strategy(runs, s, events).figures() for s in self.cfg.strategies}
        return {
            "provider": self.cfg.provider,
            "model": self.cfg.model_id,
            "runs": len(runs),
            "requests": len(events),
            "volatile_clock": self.cfg.volatile_clock,
            **({"think_time": self.cfg.think_time.spec} if self.cfg.think_time else {}),
            **({"clock_resolution_s": self.cfg.clock_resolution_s}
               if self.cfg.volatile_clock else {}),
            "simulated_hours": round(events[-1][0] / 3600, 3) if events else 0.0,
            "seconds": round(time.perf_counter() - t0, 2),
            "strategies": strategies,
        }
