"""The meaning guard under hostile input and upstream faults (issue 36): what an auditor found
broken, each test failing on the code before its fix.

- a trial send that fails (an error status, a body that is not a JSON object or over
  :data:`~prefixgate.proxy.pipeline.guard_trial.ANSWER_MAX_BYTES`, a connection reset, a
  stall past the backend's ``total_s``) ends the trial: no further send to a backend that is
  refusing or broken (a 429 was answered with two more sends), no pair, the budget's requests
  and tokens of the sends not made given back, every answer closed, the client untouched;
- a client's own generation fields never widen a trial send: ``n`` / ``best_of`` (one answer
  is compared; 64 choices cost 64 times the budget's estimate) and the client's second output
  cap (``max_tokens`` beside ``max_completion_tokens``; llama.cpp reads ``max_tokens``);
- ``meaning_guard:`` settings the sequential test refuses are refused when the policy is read,
  not by a ValueError at the proxy's start;
- a Messages trial send drops the client's ``thinking`` / ``top_p`` / ``top_k`` (Claude
  refuses them beside ``temperature: 0`` and a 16-token cap: every trial failed);
- a Responses trial send drops ``background: true`` (answered at once, queued and empty);
- a trial's rewrites run in the trials' own threads: they never hold one of the clients'
  rewrite threads (4 trials took all four; a client waited past its rewrite budget);
- a trial send (not streamed: its head comes after the whole answer) waits for its head as long
  as a client's send does (the backend's first-byte timeout), not the idle timeout alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.guard_settings import MOVES
from prefixgate.config.loader import PolicyError, parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.pipeline.guard_trial import ANSWER_MAX_BYTES, SENDS, trial_body

RULES = "Follow the airline policy. Be brief. Verify the user id first. " * 150
CAP = 16
CLIENT_TEXT = "client answer"
USAGE = {"prompt_tokens": 900, "completion_tokens": 4, "total_tokens": 904}


def _completion(text: str) -> bytes:
    return orjson.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "message": {"role": "assistant",
                                                              "content": text},
                                      "finish_reason": "stop"}], "usage": USAGE})


async def _chunks(*parts: bytes, then: BaseException | None = None,
                  stall: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    """A streamed body (so that the proxy's closing it is counted): ``parts``, then ``then``
    raised or a wait on ``stall`` (never set: a body that never ends)."""
    for p in parts:
        yield p
    if then is not None:
        raise then
    if stall is not None:
        await stall.wait()


FAULTS = ("429", "500", "not_json", "not_object", "too_big", "reset", "stall")


class FaultyTrials:
    """Client sends answered with :data:`CLIENT_TEXT`; trial sends (temperature 0, the guard's
    cap) answered ``yes``, but the send number ``at`` (0: original, 1: repeat, 2: variant) of
    each trial with ``fault``. Every body is streamed."""

    def __init__(self, fault: str, at: int) -> None:
        self.fault, self.at = fault, at
        self.trials: list[dict[str, Any]] = []
        self.never = asyncio.Event()

    def _fault(self) -> httpx.Response:
        ok = {"content-type": "application/json"}
        body = {"429": (429, b'{"error": {"message": "rate limited"}}'),
                "500": (500, b"internal error"), "not_json": (200, b"hello"),
                "not_object": (200, b"[1, 2]")}
        if self.fault in body:
            status, text = body[self.fault]
            return httpx.Response(status, content=_chunks(text), headers=ok)
        if self.fault == "too_big":  # valid JSON, but longer than the guard reads
            big = _completion("x " * ANSWER_MAX_BYTES)
            return httpx.Response(200, content=_chunks(big[:1 << 16], big[1 << 16:]), headers=ok)
        if self.fault == "reset":
            return httpx.Response(200, content=_chunks(b'{"id": ', then=httpx.ReadError("reset")),
                                  headers=ok)
        assert self.fault == "stall"
        return httpx.Response(200, content=_chunks(b'{"id": ', stall=self.never), headers=ok)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ok = {"content-type": "application/json"}
        if body.get("temperature") != 0:  # a client send
            return httpx.Response(200, content=_chunks(_completion(CLIENT_TEXT)), headers=ok)
        self.trials.append(body)
        if (len(self.trials) - 1) % SENDS == self.at:
            return self._fault()
        return httpx.Response(200, content=_chunks(_completion("yes")), headers=ok)


def _policy(tmp: Path, guard: dict[str, Any] | None = None,
            backend: dict[str, Any] | None = None) -> Any:
    return parse_policy({
        "backends": {"up": {"kind": "openai_compat", "base_url": "http://up.test/v1",
                            **(backend or {})}},
        "routes": [{"match": "*", "backend": "up"}],
        "ledger": {"path": str(tmp / "ledger.sqlite"), "batch_writes": False},
        "default_max_tokens": 0,
        "rewrite": {"hoist_volatile": "guarded", "time_budget_ms": 20000,
                    **{m: "off" for m in MOVES if m != "hoist_volatile"}},
        "meaning_guard": {"max_tokens": CAP, **(guard or {})},
    })


def _turn(i: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Turn ``i`` of a session whose system prompt's clock changes every turn (hoisting applies
    from the second turn on)."""
    msgs: list[dict[str, Any]] = [{"role": "system",
                                   "content": f"You are Helper. Now: 2025-03-04 10:{15 + i:02d}. "
                                              f"{RULES}"}]
    for j in range(i):
        msgs += [{"role": "user", "content": f"Q{j}"}, {"role": "assistant", "content": f"A{j}"}]
    msgs.append({"role": "user", "content": f"Q{i}"})
    return {"model": "m", "messages": msgs, **(extra or {})}


async def _two_turns(app: Any, extra: dict[str, Any] | None = None) -> list[httpx.Response]:
    """Two turns of one session (the second gets a trial), the trials drained after each."""
    state = app.state.proxy
    await state.upstream.start()
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://pg") as c:
        for i in range(2):
            out.append(await c.post("/v1/chat/completions", json=_turn(i, extra),
                                    headers={"x-prefixgate-session": "s"}))
            await state.meaning_guard.drain()
    return out


@pytest.mark.parametrize("fault,at", [(f, 0) for f in FAULTS] + [("429", 1), ("reset", 1),
                                                                  ("stall", 2), ("500", 2)])
async def test_a_failed_trial_send_ends_the_trial_and_gives_back_what_was_not_sent(
        tmp_path: Path, fault: str, at: int) -> None:
    """The fault at the original, the repeat or the variant: no send after it (a failure at the
    variant, the last send, was already handled: the control of the other positions)."""
    policy = _policy(tmp_path, backend={"timeouts": {"total_s": 0.2}})  # a stall ends at 0.2 s
    up = FaultyTrials(fault, at)
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(up), analyze=False)
    guard = app.state.proxy.meaning_guard
    held: list[Any] = []
    reserve = guard.budgets.reserve

    async def recording(*args: Any) -> Any:
        held.append(await reserve(*args))
        return held[-1]

    guard.budgets.reserve = recording
    answers = await _two_turns(app)
    assert [(r.status_code, r.json()["choices"][0]["message"]["content"]) for r in answers] == [
        (200, CLIENT_TEXT)] * 2
    # the sends up to the failed one, none after it
    assert len(up.trials) == at + 1
    led = Ledger(policy.ledger.path)
    rows = [(r["status"], r["http_status"]) for r in led.rows(trials=True) if r["trial"]]
    led.close()
    assert rows[:at] == [("ok", 200)] * at and len(rows) == at + 1
    assert rows[at][0] != "ok" and rows[at][1] == {"429": 429, "500": 500}.get(fault, 502)
    # no pair; counted as failed
    got = (await guard.book.verdicts("*", "", ["hoist_volatile"]))["hoist_volatile"]
    assert got.pairs == 0 and guard.counts["failed"] == 1
    # the budget: the sends made (the answered ones at their usage, the failed one at its share
    # of the estimate); the requests and tokens of the sends not made are back
    assert len(held) == 1 and held[0] is not None
    spent = await guard.budgets.spent("*")
    assert spent["requests"] == at + 1
    assert spent["tokens"] == at * USAGE["total_tokens"] + held[0].tokens // SENDS
    assert app.state.proxy.upstream.in_use == 0  # every answer closed, the clients' too
    assert guard.running == 0 and not guard.tasks


@pytest.mark.parametrize("fields,caps", [
    ({"n": 64}, ("max_tokens",)),
    ({"n": 8, "best_of": 9, "max_tokens": 100_000}, ("max_tokens",)),
    ({"max_completion_tokens": 4000, "max_tokens": 100_000}, ("max_tokens", "max_completion_tokens")),
    ({"max_completion_tokens": 4000, "n": 2}, ("max_completion_tokens",)),
    ({"n_predict": 99_999}, ("max_tokens",)),
])
def test_a_trial_send_asks_for_one_answer_within_the_guards_cap(
        fields: dict[str, Any], caps: tuple[str, ...]) -> None:
    """Whatever the client asked for: one choice (``n`` / ``best_of`` dropped) and every output
    cap field the body carries at the guard's cap (a backend reading the other one, or
    llama.cpp's ``n_predict``, would otherwise generate to the client's cap)."""
    body = orjson.loads(trial_body(orjson.dumps({"model": "m", "messages": [], **fields}),
                                   "openai", CAP))
    assert not {"n", "best_of", "n_predict"} & body.keys()
    assert {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body} == {
        c: CAP for c in caps}


async def test_a_clients_n_never_reaches_a_trial_send(tmp_path: Path) -> None:
    """Through the app: a client asking for 64 choices and a 100k ``max_tokens`` beside its
    ``max_completion_tokens`` is answered as it asked; its trial sends ask for one answer within
    the guard's cap."""
    policy = _policy(tmp_path)
    up = FaultyTrials("429", at=-1)  # no fault
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(up), analyze=False)
    extra = {"n": 64, "max_tokens": 100_000, "max_completion_tokens": 50_000}
    answers = await _two_turns(app, extra)
    assert [r.status_code for r in answers] == [200, 200]
    assert len(up.trials) == SENDS
    assert all("n" not in t and t["max_completion_tokens"] == CAP for t in up.trials)


@pytest.mark.parametrize("guard,says", [
    ({"look_every": 20, "max_pairs": 19}, "look_every"),
    ({"look_every": 5, "max_pairs": 4}, "look_every"),
    ({"margin": 0.0}, "margin"),
    ({"margin": 1.0}, "margin"),
    ({"max_pairs": 32767, "look_every": 1}, "max_pairs"),
])
def test_guard_settings_the_test_refuses_are_refused_with_the_policy(
        guard: dict[str, Any], says: str, tmp_path: Path) -> None:
    """A policy check names the key; before, the policy read fine and the proxy's start died
    on the sequential test's ValueError."""
    with pytest.raises(PolicyError, match=f"meaning_guard.*{says}"):
        _policy(tmp_path, guard)


@pytest.mark.parametrize("guard", [
    {"look_every": 20, "max_pairs": 20},
    {"look_every": 1, "max_pairs": 1},
    {"margin": 0.001},
    {"margin": 0.999},
    {"max_pairs": 32766, "look_every": 1},
])
def test_guard_settings_at_the_edges_start_a_guard(guard: dict[str, Any], tmp_path: Path) -> None:
    policy = _policy(tmp_path, guard)
    app = build_app(policy, ledger=Ledger(policy.ledger.path), analyze=False)
    rule = app.state.proxy.meaning_guard.book.rule
    assert (rule.look_every, rule.max_pairs, rule.margin) == (
        policy.meaning_guard.look_every, policy.meaning_guard.max_pairs, policy.meaning_guard.margin)


@pytest.mark.parametrize("timeouts,head_s", [
    ({"first_byte_s": 120.0, "idle_s": 5.0}, 120.0),   # a long prefill: the head waits for it
    ({"first_byte_s": 5.0, "idle_s": 30.0}, 30.0),
    ({"idle_s": 7.0}, 600.0),                          # first byte unset: the backend's timeout_s
])
async def test_a_trial_send_waits_for_its_head_as_long_as_a_clients_send(
        tmp_path: Path, timeouts: dict[str, float], head_s: float) -> None:
    """A trial send is not streamed: its head comes after the whole answer, prefill included
    (on our engine at background priority, only in steps no client uses). Its transport wait
    is the backend's first-byte timeout when longer than the idle one, as a client's
    non-streamed send's is; before, the idle one alone: a backend with ``first_byte_s: 120,
    idle_s: 5`` failed every trial of a long prompt, and the move never had a verdict."""
    policy = _policy(tmp_path, backend={"timeouts": timeouts})
    up = FaultyTrials("429", at=-1)  # no fault
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(up), analyze=False)
    guard = app.state.proxy.meaning_guard
    waits: list[float] = []
    send = guard.send

    async def recording(url: str, headers: Any, body: bytes, timeout_s: float,
                        **kw: Any) -> Any:
        waits.append(timeout_s)
        return await send(url, headers, body, timeout_s, **kw)

    guard.send = recording
    await _two_turns(app)
    assert waits == [head_s] * SENDS
    assert guard.counts["failed"] == 0


@pytest.mark.parametrize("fields", [
    {"thinking": {"type": "enabled", "budget_tokens": 2048}},
    {"thinking": {"type": "enabled", "budget_tokens": 1024}, "temperature": 1},
    {"top_p": 0.9},
    {"top_k": 40, "top_p": 0.5},
    {},
])
def test_a_messages_trial_send_is_one_claude_accepts_at_temperature_0(
        fields: dict[str, Any]) -> None:
    """Claude refuses (400) extended thinking with a ``budget_tokens`` not below ``max_tokens``
    (or under 1024) or beside a temperature, and ``temperature`` beside ``top_p`` on its recent
    models: a client's ``thinking`` or ``top_p`` kept in every trial send of its route failed
    them all (the move never had a verdict). At temperature 0 neither changes the answer kept
    for comparison; the cap and temperature are the guard's."""
    body = orjson.loads(trial_body(orjson.dumps({"model": "claude-x", "max_tokens": 8192,
                                                 "messages": [], **fields}), "anthropic", CAP))
    assert not {"thinking", "top_p", "top_k"} & body.keys()
    assert (body["temperature"], body["max_tokens"], body["stream"]) == (0, CAP, False)


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_trial_rewrites_never_take_a_clients_rewrite_thread(
        tmp_path: Path, concurrency: int) -> None:
    """Client rewrites run in at most REWRITE_THREADS threads, and waiting for one counts
    against the request's rewrite budget. A trial's rewrites (the move forced on) run in their
    own: while ``concurrency`` trials are rewriting, every client thread is free and a client
    is rewritten at once; before, each trial held one of the clients' threads (4 trials: a
    client waited past its budget and went upstream not rewritten)."""
    import threading

    from prefixgate.proxy.pipeline import rewrite

    policy = _policy(tmp_path, guard={"concurrency": concurrency})
    up = FaultyTrials("429", at=-1)  # no fault
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(up), analyze=False)
    state = app.state.proxy
    guard = state.meaning_guard
    inner, release = guard.rewrite_fn, threading.Event()
    inside: list[int] = []

    def held(*args: Any) -> Any:  # a trial's rewrite, kept running until released
        inside.append(1)
        release.wait(10)
        return inner(*args)

    await state.upstream.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://pg") as c:
        async def post(i: int, sid: str) -> httpx.Response:
            return await c.post("/v1/chat/completions", json=_turn(i),
                                headers={"x-prefixgate-session": sid})

        for k in range(concurrency):  # turn 0: the clock seen (no trial yet)
            await post(0, f"s{k}")
            await guard.drain()
        guard.rewrite_fn = held
        try:
            for k in range(concurrency):  # turn 1: a trial each, its rewrite held
                assert (await post(1, f"s{k}")).status_code == 200
            for _ in range(500):  # until the trials' rewrites are in their threads
                if len(inside) == concurrency:
                    break
                await asyncio.sleep(0.002)
            assert len(inside) == concurrency and guard.running == concurrency
            lim = rewrite._rewrite_limiter()
            assert lim.available_tokens == lim.total_tokens == rewrite.REWRITE_THREADS
            answer = await post(0, "another")
            assert answer.status_code == 200
        finally:
            release.set()
            await guard.drain()
    assert "over_budget" not in answer.headers.get("x-prefixgate-edits", "")
    assert len(up.trials) == concurrency * SENDS


@pytest.mark.parametrize("fields", [{"background": True}, {"background": False}, {}])
def test_a_responses_trial_send_is_answered_in_its_own_reply(fields: dict[str, Any]) -> None:
    """A Responses body with ``background: true`` is answered at once with an empty queued
    response (the answer comes later, by polling): kept in a trial send, every trial's original
    decided nothing and the move never had a verdict. The trial asks for its answer now."""
    body = orjson.loads(trial_body(orjson.dumps({"model": "gpt-x", "input": "hi", **fields}),
                                   "responses", CAP))
    assert "background" not in body
    assert (body["temperature"], body["max_output_tokens"], body["stream"]) == (0, CAP, False)
