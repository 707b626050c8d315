"""The automatic session id ignores every volatile span (issue 19, item 4):
``prefixgate/proxy/pipeline/session_key.py``.

One conversation is one session whatever request ids, clocks and counters its system prompt and
first user message carry; two conversations (another first user text) are two sessions.
"""

from __future__ import annotations

import base64
import string
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.proxy.pipeline import session_key
from prefixgate.proxy.pipeline.session_key import (
    MASK,
    SESSION_TEXT_CHARS,
    key_text,
    mask_line,
    session_id_for,
)
from tests.proxy.upstream import Script, completion

H = {"authorization": "Bearer k1"}


def chat(system: str, user: str, *rest: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}, *rest]}


# -- the issue's case ---------------------------------------------------------------------------

def issue_turns(n: int = 13) -> list[dict[str, Any]]:
    """The new user's 13-turn loop: a request UUID in the system prompt, new on every turn."""
    rules = "You are a support agent. Verify the user first. Never guess an order number. " * 30
    out, history = [], []
    for k in range(n):
        system = f"Request ID: {uuid.uuid4()}\n{rules}"
        body = chat(system, "Where is my order?", *history)
        out.append(body)
        history += [{"role": "assistant", "content": f"answer {k}"},
                    {"role": "user", "content": f"follow-up {k}"}]
    return out


def test_a_request_uuid_in_the_system_prompt_keeps_13_turns_one_session() -> None:
    ids = {session_id_for(H, b) for b in issue_turns()}
    assert len(ids) == 1


def test_the_issues_loop_is_one_session_in_the_ledger(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    for body in issue_turns():
        assert httpx.post(rig.url + "/v1/chat/completions", json=body, headers=H,
                          timeout=30).status_code == 200
    assert len({r["session"] for r in rig.ledger.rows()}) == 1
    other = chat(f"Request ID: {uuid.uuid4()}\nYou are a support agent.", "Cancel my plan.")
    httpx.post(rig.url + "/v1/chat/completions", json=other, headers=H, timeout=30)
    assert len({r["session"] for r in rig.ledger.rows()}) == 2


# -- each kind the detectors name, in both texts ------------------------------------------------

KINDS: dict[str, tuple[str, str]] = {
    "uuid": ("id 123e4567-e89b-42d3-a456-426614174000", "id 9f1c2d3e-aaaa-4bbb-8ccc-ddddeeeeffff"),
    "hex id": ("ref 4f2a9c0d1e3b5a7f", "ref ab12cd34ef56ab78"),
    "labelled id": ("request_id: req_8fJ2kLmNqRsTuV", "request_id: req_Zx7yW6vU5tS4rQ"),
    "base64 id": ("token Xk9aB3dE5fG7hJ2kL4mN", "token Qw8eR7tY6uI5oP4aS3dF"),
    "iso datetime": ("now 2024-05-15T15:00:07Z", "now 2024-05-15T16:11:59Z"),
    "clock": ("Current time: 10:15", "Current time: 11:42"),
    "rfc2822": ("Tue, 04 Mar 2025 10:15:00 +0000", "Wed, 05 Mar 2025 11:16:01 +0000"),
    "long datetime": ("March 4, 2025 at 10:15 AM", "March 4, 2025 at 9:05 PM"),
    "epoch": ("timestamp 1715785200", "timestamp 1715789999"),
    "counter": ("turn 7 of the task", "turn 12 of the task"),
    # only the passes' detector (prefixgate/rewriter/analysis/volatile_spans.py) names these two
    "labelled id, lower case": ("conversation id: conv_abc123def456ghi",
                                "conversation id: conv_xyz789uvw012rst"),
    "clock with a fraction": ("as of 10:15:07.123", "as of 10:15:08.9"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("where", ["system", "first user"])
def test_each_volatile_kind_leaves_the_session(kind: str, where: str) -> None:
    a, b = KINDS[kind]
    base_sys, base_user = "You are Helper. Be brief.", "Please help me with my booking."

    def body(span: str) -> dict[str, Any]:
        if where == "system":
            return chat(f"{base_sys}\n{span}\nEnd.", base_user)
        return chat(base_sys, f"{base_user} ({span})")

    assert session_id_for(H, body(a)) == session_id_for(H, body(b))
    assert MASK in mask_line(a) and MASK in mask_line(b)


def test_every_span_of_both_rooms_detectors_is_masked() -> None:
    from prefixgate.cache.savings.break_spans import IDENTITY_PATTERNS
    from prefixgate.cache.savings.break_spans import find_spans as cache_find
    from prefixgate.rewriter.analysis.volatile_spans import find_spans as pass_find

    for a, b in KINDS.values():
        for text in (a, b):
            found = [(sp.start, sp.end) for sp in pass_find(text)] + [
                (s, e) for s, e, _ in cache_find(text)] + [
                m.span("v" if "v" in rx.groupindex else 0)
                for _, rx in IDENTITY_PATTERNS for m in rx.finditer(text)]
            assert found, text
            masked = mask_line(text)
            for s, e in found:  # no character of a span survives: the mask took its place
                assert text[s:e] not in masked.replace(MASK, " "), (text, text[s:e])


def test_the_first_users_own_numbers_tell_conversations_apart() -> None:
    assert session_id_for(H, chat("S", "what is 2+2")) != session_id_for(H, chat("S", "what is 3+3"))
    assert session_id_for(H, chat("S", "fix issue #12")) != session_id_for(H, chat("S", "fix issue #13"))
    # the system text masks every digit (case B03): a version number there is not a new session
    assert session_id_for(H, chat("Agent v2.1", "q")) == session_id_for(H, chat("Agent v2.2", "q"))


def test_the_key_header_and_the_explicit_session_still_decide() -> None:
    b = chat("S", "q")
    assert session_id_for({"authorization": "Bearer k2"}, b) != session_id_for(H, b)
    assert session_id_for({"x-prefixgate-session": "abc"}, b) == "abc"


def test_responses_bodies_use_instructions_and_input() -> None:
    def resp(inp: Any, rid: str) -> dict[str, Any]:
        return {"model": "m", "instructions": f"You are Helper. Request {rid}.", "input": inp}

    ids = (str(uuid.uuid4()), str(uuid.uuid4()))
    assert len({session_id_for(H, resp("Book a flight", i)) for i in ids}) == 1
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Book a flight"}]}]
    assert session_id_for(H, resp(items, ids[0])) == session_id_for(H, resp("Book a flight", ids[1]))
    assert session_id_for(H, resp("Cancel a flight", ids[0])) != session_id_for(
        H, resp("Book a flight", ids[0]))


# -- bounded, fast, keeps no text ---------------------------------------------------------------

def test_only_the_first_session_text_chars_count_and_a_cut_line_is_left_out() -> None:
    line = "Rules of the road, to be read in full before answering anything. " * 3 + "\n"
    rules = line * (SESSION_TEXT_CHARS // len(line) + 10)
    a = chat(rules + "tail one", "q")
    b = chat(rules + "tail two", "q")
    assert session_id_for(H, a) == session_id_for(H, b)  # past the bound
    # a span of another length before the cut moves the cut inside the last line
    short, long_ = (chat(f"at 9:05 {rules}", "q"), chat(f"at 10:05:07 {rules}", "q"))
    assert session_id_for(H, short) == session_id_for(H, long_)
    assert len(key_text(rules, True)) <= SESSION_TEXT_CHARS


def test_a_new_turn_scans_only_the_lines_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = session_key.mask_line
    monkeypatch.setattr(session_key, "mask_line", lambda line: calls.append(line) or real(line))
    rules = "".join(f"Rule {i}: refunds within {i + 1} days.\n" for i in range(200))
    for k in range(3):
        session_id_for(H, chat(f"Request ID: {uuid.uuid4()}\n{rules}", f"trace {uuid.uuid4().hex}"))
        if k == 0:
            assert len(calls) >= 200
            calls.clear()
    assert len(calls) == 4  # two turns x (the UUID line + the user's line)


def test_the_memo_is_bounded_and_holds_no_prompt_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_key, "MEMO_LINES", 8)
    secret = "my secret order 12345 for Ms Jones"
    for i in range(20):
        session_id_for(H, chat(f"line {i}\n{secret}", f"{secret} {i}"))
    for memo in (session_key._SYSTEM_MEMO, session_key._USER_MEMO):
        assert len(memo.table) <= 8
        assert all(isinstance(k, int) and "secret" not in v for k, v in memo.table.items())


def test_a_resent_turn_takes_its_id_from_the_memo_and_it_is_the_rules_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    system, user = f"Request ID: {uuid.uuid4()}\nBe brief.", f"trace {uuid.uuid4().hex}"
    first = session_id_for(H, chat(system, user))
    assert first == session_key.session_id_of("Bearer k1", system, user)
    calls: list[str] = []
    monkeypatch.setattr(session_key, "key_text", lambda *a: calls.append("x") or "")
    later = chat(system, user, {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": "next"})
    assert session_id_for(H, later) == first and calls == []  # turn N: no line scanned
    # the memo tells keys and texts apart: each still takes the rule (the patched key_text)
    assert session_id_for({"authorization": "Bearer k2"}, later) != first
    assert session_id_for(H, chat(system + "!", user)) != first
    assert session_id_for(H, chat(system, user + "!")) != first
    assert len(calls) == 6


def test_the_id_memo_is_bounded_and_holds_no_prompt_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_key, "MEMO_IDS", 4)
    session_key._IDS.clear()
    ids = [session_id_for(H, chat("my secret", f"order {i} for Ms Jones")) for i in range(10)]
    assert len(set(ids)) == 10 and 0 < len(session_key._IDS) <= 4
    assert all(isinstance(k, int) and v.startswith("auto-") and "secret" not in v
               for k, v in session_key._IDS.items())
    assert session_id_for(H, chat("my secret", "order 0 for Ms Jones")) == ids[0]  # recomputed


# -- the property: generated conversations -----------------------------------------------------

WORDS = st.text(string.ascii_lowercase, min_size=1, max_size=8)
_HEXLET, _DIG = set("abcdef"), set(string.digits)
HEX_IDS = st.binary(min_size=8, max_size=32).map(bytes.hex).filter(
    lambda h: bool(set(h) & _HEXLET) and bool(set(h) & _DIG))
"""Hex ids as ``secrets.token_hex`` writes them, with a letter and a digit (an all-decimal run
reads as a number)."""
B64_IDS = st.binary(min_size=12, max_size=48).map(
    lambda b: base64.urlsafe_b64encode(b).decode()).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isupper() for c in s)
    and any(c.islower() for c in s))
"""base64url ids (``secrets.token_urlsafe``) with a digit and both cases, padding kept."""
STAMPS = st.datetimes().filter(lambda d: 2000 <= d.year < 2100)
SLOTS: dict[str, Any] = {
    "uuid": st.uuids().map(lambda u: f"Request ID: {u}"),
    "hex": HEX_IDS.map(lambda h: f"trace {h}"),
    "b64": B64_IDS.map(lambda s: f"session token {s}"),
    "iso": STAMPS.map(lambda d: f"The current time is {d.isoformat(sep=' ', timespec='seconds')}."),
    "clock": st.tuples(st.integers(0, 23), st.integers(0, 59)).map(lambda t: f"Now: {t[0]}:{t[1]:02d}"),
    "epoch": st.integers(1_500_000_000, 1_999_999_999).map(lambda n: f"timestamp={n}"),
    "counter": st.integers(1, 10**6).map(lambda n: f"Turn {n}."),
}


@st.composite
def conversations(draw: Any) -> tuple[list[str], list[str], list[str]]:
    """``(kinds, system words, user words)``: a template; ``fill`` draws its volatile values."""
    kinds = draw(st.lists(st.sampled_from(sorted(SLOTS)), min_size=1, max_size=6))
    return kinds, draw(st.lists(WORDS, min_size=1, max_size=20)), draw(
        st.lists(WORDS, min_size=1, max_size=12))


def fill(draw: Any, conv: tuple[list[str], list[str], list[str]]) -> dict[str, Any]:
    kinds, sys_words, user_words = conv
    values = [draw(SLOTS[k]) for k in kinds]
    half = len(values) // 2
    system = " ".join(sys_words) + "\n" + "\n".join(values[half:] or ["-"])
    user = " ".join([*values[:half], "|", *user_words, "|", values[-1]])
    return chat(system, user)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), data=st.data())
def test_one_conversation_is_one_session_whatever_its_ids_clocks_counters(conv: Any, data: Any) -> None:
    a, b = fill(data.draw, conv), fill(data.draw, conv)
    assert session_id_for(H, a) == session_id_for(H, b)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), other=st.lists(WORDS, min_size=1, max_size=12), data=st.data())
def test_another_first_user_text_is_another_session(conv: Any, other: list[str], data: Any) -> None:
    kinds, sys_words, user_words = conv
    if other == user_words:
        other = [*other, "more"]
    a, b = fill(data.draw, conv), fill(data.draw, (kinds, sys_words, other))
    assert session_id_for(H, a) != session_id_for(H, b)
