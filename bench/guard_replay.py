"""The proxy in front of a scripted upstream, and tau-bench sessions replayed through it as
clients: the rig of ``bench/meaning_guard.py`` and ``tests/proxy/test_meaning_guard_upstreams.py``.

- :func:`tau_sessions`: tau-bench airline runs (``../shared/data/traces``, read in place) as
  sessions of OpenAI Chat bodies, model ``gpt-4o-mini``; the system prompt's clock line shows a
  simulated wall clock that advances by a seeded 6..90 s between a session's requests (what
  ``prefixgate replay --volatile-clock`` does with the real clock, which a fast replay would not
  move).
- :func:`policy_doc`: the policy — one ``openai`` backend (a hosted-looking route: priced model,
  no trials until a budget is set) at the upstream, every model routed to it; rewrite settings
  and the guard's settings are the shipped defaults unless given; ``budget``: the route's
  ``meaning_guard_budget``.
- :class:`Rig`: the upstream (:class:`bench.guard_upstreams.GuardUpstream`) and the real proxy
  app (``build_app``), each under uvicorn on a loopback port (:func:`tests.servers.serve_app`).
- :func:`send`: one client request, streamed with usage (as agents and ``prefixgate replay``
  send), read into a :class:`Sent` (answer id, usage, the guard / edits headers).
- :func:`guard_states`: ``x-prefixgate-guard`` parsed into ``{move: (state, pairs)}``;
  :func:`applied_passes`: the passes ``x-prefixgate-edits`` names as applied.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.guard_upstreams import Behaviour, GuardUpstream

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
MODEL = "gpt-4o-mini"
START = 1_715_803_200.0
"""2024-05-15 20:00 UTC: the simulated clock's first reading."""
MOVES = ("hoist_volatile", "stabilise_passages", "prune_tools", "prune_history", "prune_rag")


def tau_sessions(runs: int, first: int = 0, seed: int = 36, max_requests: int | None = None
                 ) -> list[list[dict[str, Any]]]:
    """``runs`` tau-bench runs from run ``first`` as sessions of Chat bodies (module
    docstring); ``max_requests``: at most that many requests per session."""
    from prefixgate.proxy.sim.traces import load_tau, openai_body
    from prefixgate.proxy.sim.wall_clock import with_wall_clock

    rng = random.Random(seed)
    out = []
    for run in load_tau(TRACE, runs=first + runs)[first:]:
        t = START + rng.randint(0, 86_400)
        bodies = []
        for r in run.requests[:max_requests]:
            bodies.append(with_wall_clock(openai_body(MODEL, run.tools, r.messages), t))
            t += rng.randint(6, 90)
        out.append(bodies)
    return out


def policy_doc(upstream_url: str, ledger: Path, budget: dict[str, Any] | None = None,
               rewrite: dict[str, Any] | None = None, guard: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proxy's policy (module docstring); ``extra``: more top-level keys (``tenants``)."""
    route: dict[str, Any] = {"match": "*", "backend": "up"}
    if budget is not None:
        route["meaning_guard_budget"] = budget
    doc: dict[str, Any] = {
        "backends": {"up": {"kind": "openai", "base_url": upstream_url + "/v1"}},
        "routes": [route],
        "ledger": {"path": str(ledger), "batch_writes": False}}
    if rewrite:
        doc["rewrite"] = rewrite
    if guard:
        doc["meaning_guard"] = guard
    return {**doc, **(extra or {})}


def forced(mode: str | bool) -> dict[str, Any]:
    """Rewrite settings with every move forced to ``mode`` (``"on"`` / ``"off"`` / a bool)."""
    return {m: mode for m in MOVES}


@dataclass
class Sent:
    """One client request as the client saw it."""

    session: int
    turn: int
    status: int
    answer_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    guard: str = ""
    edits: str = ""
    text: str = ""
    tool: str = ""


def send(client: httpx.Client, url: str, body: dict[str, Any], session: str, turn: int,
         index: int, tenant: str | None = None, max_tokens: int = 64) -> Sent:
    """POST ``body`` streamed (``stream_options.include_usage``, temperature 0, ``max_tokens``)
    as session ``session``; the answer read from its SSE events."""
    headers = {"x-prefixgate-session": session}
    if tenant:
        headers["x-prefixgate-tenant"] = tenant
    req = {**body, "stream": True, "stream_options": {"include_usage": True},
           "temperature": 0, "max_tokens": max_tokens}
    with client.stream("POST", url + "/v1/chat/completions", json=req, headers=headers) as r:
        out = Sent(index, turn, r.status_code, guard=r.headers.get("x-prefixgate-guard", ""),
                   edits=r.headers.get("x-prefixgate-edits", ""))
        if r.status_code != 200:
            r.read()
            return out
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            out.answer_id = ev.get("id") or out.answer_id
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                out.text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    out.tool += (tc.get("function") or {}).get("name") or ""
            usage = ev.get("usage")
            if usage:
                out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                out.cached_tokens = int((usage.get("prompt_tokens_details") or {})
                                        .get("cached_tokens") or 0)
    return out


_ITEM = re.compile(r"([a-z_]+)=(trialling|on|off)\s*(?:\((\d+) pairs?)?")


def guard_states(header: str) -> dict[str, tuple[str, int]]:
    """``x-prefixgate-guard`` (``hoist_volatile=trialling (12 pairs); prune_tools=on (40
    pairs, ...)``) as ``{move: (state, pairs)}``; pairs 0 when not given."""
    return {m.group(1): (m.group(2), int(m.group(3) or 0)) for m in _ITEM.finditer(header or "")}


def applied_passes(edits: str) -> set[str]:
    """The passes an ``x-prefixgate-edits`` summary names as applied (``name``, ``name:2``,
    ``name:1-812``; ``!name`` failed and ``none`` are not)."""
    return {m.group() for item in edits.split(";") if not item.startswith("!")
            for m in [re.match(r"[a-z_]+", item)] if m and m.group() != "none"}


@dataclass
class Rig:
    """The upstream and the proxy in front of it (module docstring); ``url``: the proxy."""

    upstream: GuardUpstream
    url: str
    app: Any
    sent: list[Sent] = field(default_factory=list)

    def replay(self, sessions: list[list[dict[str, Any]]], tag: str, tenant: str | None = None,
               first_index: int = 0, think: bool = False) -> list[Sent]:
        """Send each session's requests in order, sessions one after another; returns (and
        keeps) what the client saw. ``think``: while the answer shows ``hoist_volatile``
        trialling, wait until the upstream has been quiet for 0.25 s (at most 10 s) before the
        next request — an agent's think time, in which the background trial of the request
        just answered finishes (a trial arriving while one runs is skipped, never queued)."""
        out = []
        with httpx.Client(timeout=120) as client:
            for i, bodies in enumerate(sessions, start=first_index):
                for k, body in enumerate(bodies):
                    out.append(send(client, self.url, body, f"{tag}-{i}", k, i, tenant))
                    if think and "hoist_volatile=trialling" in out[-1].guard:
                        self.settle(quiet_s=0.25, limit_s=10)
        self.sent += out
        return out

    def settle(self, quiet_s: float = 1.5, limit_s: float = 120.0) -> None:
        """Wait until no upstream call has arrived for ``quiet_s`` (background trials done)."""
        deadline = time.monotonic() + limit_s
        last, since = len(self.upstream.calls), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            n = len(self.upstream.calls)
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return

    def verdicts(self, tenant: str = "default") -> dict[str, dict[str, Any]]:
        """The guard's snapshot rows of ``tenant`` per move (``ProxyState.meaning_guard``'s
        ``snapshot()``: state, pairs, rates, reason; no prompt text), {} without a guard."""
        guard = getattr(self.app.state.proxy, "meaning_guard", None)
        rows = guard.snapshot() if guard is not None else []
        return {str(r["move"]): dict(r) for r in rows
                if isinstance(r, dict) and r.get("move") and r.get("tenant") in (tenant, "", None)}

    def trial_answers_to_clients(self) -> int:
        """Client answers that came from a call the upstream classed as a trial, plus client
        answers it cannot place (0 when every client answer is a client call's)."""
        bad = 0
        for s in self.sent:
            if s.status != 200:
                continue
            call = self.upstream.call_of(s.answer_id)
            bad += call is None or call.trial
        return bad


@contextmanager
def rig(behaviour: Behaviour, tmp: Path, budget: dict[str, Any] | None = None,
        rewrite: dict[str, Any] | None = None, guard: dict[str, Any] | None = None,
        seed: int = 36, rules: str = "openai", extra: dict[str, Any] | None = None
        ) -> Iterator[Rig]:
    """A :class:`Rig` for ``behaviour`` (policy: :func:`policy_doc`); both servers stop on exit."""
    from prefixgate.cache.ledger.store import Ledger
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.app import build_app
    from tests.servers import serve_app

    up = GuardUpstream(behaviour, seed=seed, rules=rules,
                       trial_max_tokens=int((guard or {}).get("max_tokens", 16)))
    with ExitStack() as stack:
        up_url = stack.enter_context(serve_app(up.app()))
        tmp.mkdir(parents=True, exist_ok=True)
        policy = parse_policy(policy_doc(up_url, tmp / f"{behaviour}.sqlite", budget, rewrite,
                                         guard, extra))
        app = build_app(policy, ledger=Ledger(policy.ledger.path))
        url = stack.enter_context(serve_app(app))
        yield Rig(up, url, app)
