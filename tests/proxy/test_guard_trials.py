"""The meaning guard's trials through the app (issue 36,
:mod:`prefixgate.proxy.pipeline.guard_trial`), against a scripted upstream (httpx
MockTransport) with the real rewrite pipeline.

A session whose system prompt carries a clock that changes every turn makes ``hoist_volatile``
apply from its second turn; guarded and still trialling, each such request gets one trial in
the background: three non-streamed sends at temperature 0 with the guard's small
``max_tokens`` (original, original again, variant), each a ledger row marked ``trial``. The
upstream answers trial sends with text no client answer has, so a trial answer reaching a client
would show. Budgets are counted (never a send past ``requests_per_day``), the moves' other modes
and an unbudgeted hosted route get no trial, a body the move does not change gets none, trial
rows move no savings figure, and one tenant's trials never touch another's verdicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.savings.summary import savings_document
from prefixgate.config.guard_settings import MOVES
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app

RULES = "Follow the airline policy. Be brief. Verify the user id first. " * 150  # > 1024 tokens
TRIAL_TEXT = "trial answer: never for a client"
CLIENT_TEXT = "client answer"
CAP = 16


def _completion(text: str) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 4, "total_tokens": 904}}


class Upstream:
    """Records every send; answers a trial send (temperature 0 with the guard's cap) with
    :data:`TRIAL_TEXT`, anything else with :data:`CLIENT_TEXT`."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.seen.append((request.url.path, dict(request.headers), body))
        trial = body.get("temperature") == 0 and body.get("max_tokens") == CAP
        if body.get("stream"):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": CLIENT_TEXT},
                                  "finish_reason": "stop"}]}
            sse = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=_completion(TRIAL_TEXT if trial else CLIENT_TEXT))

    def trials(self) -> list[dict[str, Any]]:
        return [b for _, _, b in self.seen if b.get("max_tokens") == CAP]


def _policy(tmp: Path, *, mode: str = "guarded", kind: str = "openai_compat",
            guard: dict[str, Any] | None = None, tenants: bool = False) -> Any:
    data: dict[str, Any] = {
        "backends": {"up": {"kind": kind, "base_url": "http://up.test/v1",
                            "api_key": "${PG_GUARD_TEST_KEY}"}},
        "routes": [{"match": "*", "backend": "up"}],
        "ledger": {"path": str(tmp / "ledger.sqlite"), "batch_writes": False},
        "default_max_tokens": 0,
        "rewrite": {"hoist_volatile": mode, "time_budget_ms": 20000,  # the one guarded move
                    **{m: "off" for m in MOVES if m != "hoist_volatile"}},
        "meaning_guard": {"max_tokens": CAP, **(guard or {})},
    }
    if tenants:
        data["tenants"] = {"header": "on"}
    return parse_policy(data)


def _turn(i: int, model: str = "m", clock: bool = True) -> dict[str, Any]:
    now = f"Now: 2025-03-04 10:{15 + i:02d}. " if clock else ""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": f"You are Helper. {now}{RULES}"}]
    for j in range(i):
        msgs += [{"role": "user", "content": f"Q{j}"}, {"role": "assistant", "content": f"A{j}"}]
    msgs.append({"role": "user", "content": f"Q{i}"})
    return {"model": model, "messages": msgs}


Session = Callable[..., Any]


@pytest.fixture(autouse=True)
def _backend_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_GUARD_TEST_KEY", "backend-key")


@pytest.fixture
def session(tmp_path: Path) -> Session:
    """``await session(policy, turns, ...)`` -> (client answers, upstream, app state): one
    session's turns sent one by one, the background trials drained after each."""
    async def run(policy: Any, turns: int, *, model: str = "m", clock: bool = True,
                  tenant: str | None = None, app: Any = None, up: Upstream | None = None,
                  sid: str = "s1", stream: bool = False
                  ) -> tuple[list[httpx.Response], Upstream, Any]:
        up = up or Upstream()
        if app is None:
            app = build_app(policy, ledger=Ledger(policy.ledger.path),
                            transport=httpx.MockTransport(up), analyze=False)
        state = app.state.proxy
        await state.upstream.start()
        headers = {"x-prefixgate-session": sid, "authorization": "Bearer client-secret"}
        if tenant:
            headers["x-prefixgate-tenant"] = tenant
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://pg") as c:
            for i in range(turns):
                body = _turn(i, model, clock)
                if stream:
                    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
                r = await c.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                out.append(r)
                if state.meaning_guard is not None:
                    await state.meaning_guard.drain()
        return out, up, state
    return run


async def test_a_guarded_move_that_applies_gets_trials_no_client_sees(
        tmp_path: Path, session: Session) -> None:
    answers, up, state = await session(_policy(tmp_path), 4)
    # turn 1: the clock not yet seen changing; turns 2-4: hoisting applies -> one trial each
    trials = up.trials()
    assert len(trials) == 3 * 3
    # each answer says the move's standing when it was sent (pipeline.guard_moves)
    assert [r.headers.get("x-prefixgate-guard") for r in answers] == [
        f"hoist_volatile=trialling ({n})" for n in ("0 pairs", "0 pairs", "1 pair", "2 pairs")]
    assert len(up.seen) == len(answers) + 3 * 3
    assert all(r.json()["choices"][0]["message"]["content"] == CLIENT_TEXT for r in answers)
    for t in trials:
        assert t["temperature"] == 0 and t["max_tokens"] == CAP and t["stream"] is False
    for k in range(3):
        original, repeat, variant = trials[3 * k: 3 * k + 3]
        assert original == repeat and original != variant
        assert "Now: 2025-03-04" in original["messages"][0]["content"]  # not hoisted
        assert "Now: 2025-03-04" not in variant["messages"][0]["content"]  # hoisted
    trial_headers = [h for _, h, b in up.seen if b.get("max_tokens") == CAP]
    assert {h["authorization"] for h in trial_headers} == {"Bearer backend-key"}
    assert {p for p, _, b in up.seen if b.get("max_tokens") == CAP} == {"/v1/chat/completions"}
    # the verdict counted the pairs (tenant "" on route "*")
    got = await state.meaning_guard.book.verdicts("*", "", ["hoist_volatile"])
    assert got["hoist_volatile"].pairs == 3 and got["hoist_volatile"].state == "trialling"
    # one row per trial send, marked; none of them in the savings
    led = Ledger(state.policy.ledger.path)
    marked = [r for r in led.rows(trials=True) if r["trial"]]
    assert [r["trial"] for r in marked] == ["hoist_volatile"] * 9
    assert all(r["http_status"] == 200 and r["stream"] == 0 for r in marked)
    doc = savings_document(led, "24h")
    assert doc["totals"]["requests"] == len(answers) == 4
    assert doc["totals"]["prompt_tokens"] == 4 * 900
    led.close()


@pytest.mark.parametrize("kind,priority", [("local", 1), ("openai_compat", None), ("llamacpp", None)])
async def test_trials_on_our_engine_ask_for_background_priority_and_only_there(
        tmp_path: Path, session: Session, kind: str, priority: int | None) -> None:
    answers, up, _ = await session(_policy(tmp_path, kind=kind), 3)
    trials = up.trials()
    assert len(trials) == 2 * 3
    assert [t.get("priority") for t in trials] == [priority] * 6
    assert all("priority" not in b for _, _, b in up.seen if b.get("max_tokens") != CAP)


async def test_a_streamed_request_is_trialled_with_non_streamed_sends(
        tmp_path: Path, session: Session) -> None:
    _, up, _ = await session(_policy(tmp_path), 2, stream=True)
    assert len(up.trials()) == 3
    assert all(t["stream"] is False and "stream_options" not in t for t in up.trials())


async def test_the_budget_is_never_passed(tmp_path: Path, session: Session) -> None:
    """requests_per_day 6 = two trials of three sends; eight turns would make seven."""
    guard = {"local_budget": {"requests_per_day": 6, "tokens_per_day": 10_000_000}}
    _, up, state = await session(_policy(tmp_path, guard=guard), 8)
    assert len(up.trials()) == 6
    spent = await state.meaning_guard.budgets.spent("*")
    assert spent["requests"] == 6
    assert state.meaning_guard.counts["no_budget"] == 5


async def test_the_token_budget_stops_a_trial_before_its_sends(
        tmp_path: Path, session: Session) -> None:
    guard = {"local_budget": {"requests_per_day": 1000, "tokens_per_day": 1000}}
    _, up, _ = await session(_policy(tmp_path, guard=guard), 3)
    assert up.trials() == []


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_no_trial_when_the_move_is_on_or_off(tmp_path: Path, session: Session,
                                                    mode: str) -> None:
    answers, up, _ = await session(_policy(tmp_path, mode=mode), 3)
    assert up.trials() == [] and len(up.seen) == len(answers)


async def test_no_trial_on_a_hosted_route_without_a_budget(tmp_path: Path,
                                                           session: Session) -> None:
    answers, up, state = await session(_policy(tmp_path, kind="openai"), 3, model="gpt-4o")
    assert up.trials() == [] and len(up.seen) == len(answers)
    assert state.meaning_guard.counts["no_budget"] == 2  # turns 2 and 3 would have had one


async def test_a_hosted_route_with_a_budget_gets_trials(tmp_path: Path,
                                                        session: Session) -> None:
    guard = {"hosted_budget": {"requests_per_day": 30, "tokens_per_day": 1_000_000,
                               "usd_per_day": 5.0}}
    _, up, state = await session(_policy(tmp_path, kind="openai", guard=guard), 3,
                                 model="gpt-4o")
    assert len(up.trials()) == 6
    spent = await state.meaning_guard.budgets.spent("*")
    assert spent["requests"] == 6 and 0 < spent["usd"] < 5.0


async def test_no_trial_when_the_move_changes_nothing(tmp_path: Path, session: Session) -> None:
    answers, up, state = await session(_policy(tmp_path), 3, clock=False)
    assert up.trials() == [] and len(up.seen) == len(answers)
    assert state.meaning_guard.counts["not_applied"] == 3


async def test_one_tenants_trials_leave_anothers_verdict_alone(
        tmp_path: Path, session: Session) -> None:
    up = Upstream()
    policy = _policy(tmp_path, tenants=True)
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(up),
                    analyze=False)
    _, _, state = await session(policy, 4, tenant="team-a", app=app, up=up, sid="a")
    book = state.meaning_guard.book
    a = (await book.verdicts("*", "team-a", ["hoist_volatile"]))["hoist_volatile"]
    b = (await book.verdicts("*", "team-b", ["hoist_volatile"]))["hoist_volatile"]
    assert (a.pairs, b.pairs) == (3, 0)
    await session(policy, 2, tenant="team-b", app=app, up=up, sid="b")
    a2 = (await book.verdicts("*", "team-a", ["hoist_volatile"]))["hoist_volatile"]
    b2 = (await book.verdicts("*", "team-b", ["hoist_volatile"]))["hoist_volatile"]
    assert (a2.pairs, b2.pairs) == (3, 1)
    assert {v["tenant"] for v in state.meaning_guard.snapshot("team-b")} == {"team-b"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://pg") as c:
        doc = (await c.get("/api/savings", params={"tenant": "team-b"})).json()
        health = (await c.get("/healthz")).json()
    assert [(g["tenant"], g["pairs"]) for g in doc["guard"]] == [("team-b", 1)]
    assert health["guard"] == {"trialling": 2}
    assert "team-a" not in json.dumps(health) and "team-b" not in json.dumps(health)


async def test_a_decided_move_is_trialled_no_more(tmp_path: Path, session: Session) -> None:
    """max_pairs 2: the verdict is decided after two trials (on, or off when unproven); the
    later turns, where the move still applies, get none."""
    guard = {"look_every": 2, "max_pairs": 2}
    _, up, state = await session(_policy(tmp_path, guard=guard), 6)
    assert len(up.trials()) == 2 * 3
    got = await state.meaning_guard.book.verdicts("*", "", ["hoist_volatile"])
    assert got["hoist_volatile"].state in ("on", "off") and got["hoist_volatile"].pairs == 2


async def test_shutdown_cancels_a_trial_in_flight_and_releases_it(tmp_path: Path,
                                                                  session: Session) -> None:
    """A trial send hung upstream: closing the guard (the app's shutdown) cancels it; its row
    is written (``cancelled``), nothing stays in use, the client had its answers."""
    import asyncio

    reading = asyncio.Event()

    async def hang() -> Any:  # the answer's head arrives, its body never ends
        reading.set()  # the proxy holds the response and reads its body
        yield b'{"id": "c1", '
        await asyncio.sleep(3600)

    class Hung(Upstream):
        async def __call__(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
            body = json.loads(request.content)
            if body.get("max_tokens") == CAP:
                self.seen.append((request.url.path, dict(request.headers), body))
                return httpx.Response(200, content=hang(),
                                      headers={"content-type": "application/json"})
            return super().__call__(request)

    up = Hung()
    policy = _policy(tmp_path)
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(up),
                    analyze=False)
    state = app.state.proxy
    await state.upstream.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://pg") as c:
        for i in range(2):
            r = await c.post("/v1/chat/completions", json=_turn(i),
                             headers={"x-prefixgate-session": "h"})
            assert r.json()["choices"][0]["message"]["content"] == CLIENT_TEXT
            if i == 0:  # turn 1's look (the move does not apply yet) is over before turn 2
                await state.meaning_guard.drain()
    await asyncio.wait_for(reading.wait(), 60)  # the trial's rewrite runs in a thread first
    assert len(up.trials()) == 1 and len(state.meaning_guard.tasks) == 1
    held = state.upstream.in_use  # the trial's answer, open (the mock's client answers count too)
    await state.meaning_guard.close()
    assert not state.meaning_guard.tasks and state.meaning_guard.running == 0
    assert state.upstream.in_use == held - 1  # the trial's answer was closed
    led = Ledger(policy.ledger.path)
    rows = [r for r in led.rows(trials=True) if r["trial"]]
    assert [(r["status"], r["http_status"]) for r in rows] == [("cancelled", 499)]
    led.close()


async def test_verdicts_and_budgets_are_shared_through_redis(tmp_path: Path,
                                                             session: Session) -> None:
    """With ``ledger.redis_url`` the guard works over the proxy's RedisState: a second proxy
    sees the pairs the first one's trials added, and the day's budget spent."""
    import uuid

    import redis

    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")
    prefix = f"test-guard-{uuid.uuid4().hex}:"
    policy = _policy(tmp_path)
    policy = policy.model_copy(update={"ledger": policy.ledger.model_copy(
        update={"redis_url": url, "redis_prefix": prefix})})
    try:
        _, _, a = await session(policy, 3)
        other = build_app(policy, ledger=Ledger(tmp_path / "other.sqlite"),
                          transport=httpx.MockTransport(Upstream()), analyze=False)
        b = other.state.proxy.meaning_guard
        assert type(other.state.proxy.shared).__name__ == "RedisState"
        got = await b.book.verdicts("*", "", ["hoist_volatile"])
        assert got["hoist_volatile"].pairs == 2
        assert (await b.budgets.spent("*"))["requests"] == 6
    finally:
        r = redis.Redis.from_url(url)
        r.delete(*(r.keys(prefix + "*") or [prefix]))


@pytest.mark.parametrize("clock", [False, True])
async def test_five_trialling_moves_cost_one_background_rewrite_where_none_applies(
        tmp_path: Path, session: Session, clock: bool) -> None:
    """The shipped defaults guard all five moves: a request none of them changes gets ONE
    background rewrite (all forced on), not one per move; where hoisting applies, it is still
    found and trialled."""
    policy = _policy(tmp_path)
    policy = policy.model_copy(update={"rewrite": policy.rewrite.model_copy(
        update={m: "guarded" for m in MOVES})})
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(up := Upstream()), analyze=False)
    guard = app.state.proxy.meaning_guard
    calls: list[int] = []
    inner = guard.rewrite_fn

    def counting(body: Any, api: Any, ctx: Any) -> Any:
        calls.append(1)
        return inner(body, api, ctx)

    guard.rewrite_fn = counting
    answers, _, _ = await session(policy, 3, clock=clock, app=app, up=up)
    if clock:  # turns 2-3: the combined rewrite sees a change, then hoisting alone is tried
        assert len(up.trials()) == 2 * 3
    else:
        assert up.trials() == [] and len(calls) == len(answers) == 3
        assert guard.counts["not_applied"] == 3 * len(MOVES)


class ScriptedTrials(Upstream):
    """Answers each trial's sends with ``script`` (original, repeat, variant): each entry a
    text, or "" for an answer that decided nothing (empty content). The variant is the send
    whose system prompt lost its clock; the repeat, a send equal to the one before it."""

    def __init__(self, script: tuple[str, str, str]) -> None:
        super().__init__()
        self.script = script
        self.last: dict[str, Any] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("max_tokens") != CAP:
            return super().__call__(request)
        self.seen.append((request.url.path, dict(request.headers), body))
        if "Now: 2025-03-04" not in body["messages"][0]["content"]:
            text = self.script[2]
        else:
            text = self.script[1] if body == self.last else self.script[0]
        self.last = body
        return httpx.Response(200, json=_completion(text))


@pytest.mark.parametrize("script,sends,pairs,move_rate,floor_rate,undecided", [
    (("", "", ""), 3, 0, 0.0, 0.0, 3),            # nothing decided: no evidence either way
    (("", "", "text"), 3, 0, 0.0, 0.0, 3),        # no original to compare against
    (("yes", "yes", ""), 9, 3, 1.0, 0.0, 0),      # the variant decided nothing: a change
    (("yes", "", "yes"), 9, 3, 0.0, 1.0, 0),      # the repeat decided nothing: the floor moved
    (("yes", "yes", "yes"), 9, 3, 0.0, 0.0, 0),
])
async def test_a_trial_whose_original_decided_nothing_adds_no_pair(
        tmp_path: Path, session: Session, script: tuple[str, str, str], sends: int, pairs: int,
        move_rate: float, floor_rate: float, undecided: int) -> None:
    """An empty original answer (a reasoning model whose small trial cap ends inside its
    reasoning answers empty every time) is no evidence that the move keeps answers: counting
    such pairs as unchanged would turn the move on with nothing compared; its repeat and
    variant are not sent (their requests given back to the budget). Where the original
    decided, an empty repeat or variant is a change."""
    _, up, state = await session(_policy(tmp_path), 4, up=ScriptedTrials(script))
    assert len(up.trials()) == sends                     # three trials
    got = (await state.meaning_guard.book.verdicts("*", "", ["hoist_volatile"]))["hoist_volatile"]
    assert (got.pairs, got.move_rate, got.floor_rate) == (pairs, move_rate, floor_rate)
    assert state.meaning_guard.counts["undecided"] == undecided
    assert state.meaning_guard.counts["failed"] == 0
    assert (await state.meaning_guard.budgets.spent("*"))["requests"] == sends


async def test_an_anthropic_route_is_trialled_in_its_own_shape(tmp_path: Path) -> None:
    """/v1/messages to an Anthropic backend: the trial sends are Messages bodies (``max_tokens``
    the guard's cap, temperature 0, not streamed) with the backend's ``x-api-key``; the variant's
    system prompt lost its clock, the original's kept it; answers are read as Messages bodies
    (a trial answer never reaches the client)."""
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    def up(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((dict(request.headers), body))
        text = TRIAL_TEXT if body.get("max_tokens") == CAP else CLIENT_TEXT
        return httpx.Response(200, json={
            "id": "m1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 900, "output_tokens": 3}})

    data: dict[str, Any] = {
        "backends": {"up": {"kind": "anthropic", "base_url": "http://up.test",
                            "api_key": "${PG_GUARD_TEST_KEY}"}},
        "routes": [{"match": "*", "backend": "up", "meaning_guard_budget": {
            "requests_per_day": 100, "tokens_per_day": 10 ** 7, "usd_per_day": 100}}],
        "ledger": {"path": str(tmp_path / "ledger.sqlite"), "batch_writes": False},
        "rewrite": {"hoist_volatile": "guarded", **{m: "off" for m in MOVES if m != "hoist_volatile"}},
        "meaning_guard": {"max_tokens": CAP},
    }
    policy = parse_policy(data)
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(up),
                    analyze=False)
    state = app.state.proxy
    await state.upstream.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pg") as c:
        for i in range(4):
            chat = _turn(i)
            body = {"model": "claude-x", "max_tokens": 100, "system": chat["messages"][0]["content"],
                    "messages": chat["messages"][1:]}
            r = await c.post("/v1/messages", json=body,
                             headers={"x-api-key": "client-secret", "x-prefixgate-session": "a1"})
            assert r.status_code == 200 and r.json()["content"][0]["text"] == CLIENT_TEXT
            await state.meaning_guard.drain()
    trials = [(h, b) for h, b in seen if b.get("max_tokens") == CAP]
    assert len(trials) == 3 * 3
    assert {h["x-api-key"] for h, _ in trials} == {"backend-key"}
    for k in range(3):
        (_, original), (_, repeat), (_, variant) = trials[3 * k: 3 * k + 3]
        assert original == repeat and original != variant
        assert all(b["temperature"] == 0 and b["stream"] is False for b in (original, variant))
        system = (original["system"] if isinstance(original["system"], str)
                  else "".join(p["text"] for p in original["system"]))
        v_system = (variant["system"] if isinstance(variant["system"], str)
                    else "".join(p["text"] for p in variant["system"]))
        assert "Now: 2025-03-04" in system and "Now: 2025-03-04" not in v_system
    got = (await state.meaning_guard.book.verdicts("*", "", ["hoist_volatile"]))["hoist_volatile"]
    assert (got.pairs, got.move_rate, got.floor_rate) == (3, 0.0, 0.0)


async def test_trials_show_in_their_own_metrics_and_never_in_the_request_metrics(
        tmp_path: Path, session: Session) -> None:
    """``/metrics``: the trial runner's events and the verdicts by state (no names); the 9
    trial sends are not requests there (4 client requests counted, their prompt tokens only)."""
    policy = _policy(tmp_path)
    up = Upstream()
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(up),
                    analyze=False)
    await session(policy, 4, app=app, up=up)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pg") as c:
        text = (await c.get("/metrics")).text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("prefixgate_")}
    events = {k.split('"')[1]: v for k, v in samples.items()
              if k.startswith("prefixgate_guard_trial_events_total{")}
    assert events == {"trials": 3, "sends": 9, "failed": 0, "undecided": 0, "busy": 0,
                      "no_budget": 0, "not_applied": 1}
    states = {k.split('"')[1]: v for k, v in samples.items() if k.startswith("prefixgate_guard_verdicts{")}
    assert states == {"trialling": 1, "on": 0, "off": 0}
    requests = sum(v for k, v in samples.items() if k.startswith("prefixgate_requests_total{"))
    prompt = sum(v for k, v in samples.items() if k.startswith("prefixgate_prompt_tokens_total{"))
    assert (requests, prompt) == (4, 4 * 900)
    assert "hoist_volatile" not in text and "Helper" not in text


def test_the_guard_series_read_zeros_when_their_source_fails() -> None:
    from prefixgate.proxy.observe.metrics import GUARD_EVENTS, ProxyMetrics

    def broken() -> dict[str, int]:
        raise RuntimeError("snapshot failed")

    m = ProxyMetrics()
    m.watch_guard(broken, lambda: {"on": 2, "gone": 7})
    text = m.render().decode()
    for event in GUARD_EVENTS:
        assert f'prefixgate_guard_trial_events_total{{event="{event}"}} 0.0' in text
    assert 'prefixgate_guard_verdicts{state="on"} 2.0' in text
    assert 'prefixgate_guard_verdicts{state="off"} 0.0' in text and "gone" not in text
