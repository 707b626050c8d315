"""The client's cache breaks (issue 37): named in the client's text, counted only where what was
sent upstream lost reuse, in the backend's own tokens where it gave them."""

from __future__ import annotations

from prefixgate.cache.savings.break_spans import masked_excerpt
from prefixgate.cache.savings.breaks import BreakDetector, BreakRecord
from prefixgate.cache.savings.client_breaks import ClientBreaks, shared_ids
from tests.cache.helpers import wc, words

RULES = words(200, "rule")


def _system(clock: str) -> str:
    return f"You are Helper.\nCurrent time: 2026-12-06 {clock} UTC\n{RULES}"


def _body(system: str, turns: int) -> dict:
    msgs: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": "Q0"}]
    for i in range(1, turns):
        msgs += [{"role": "assistant", "content": f"A{i}"}, {"role": "user", "content": f"Q{i}"}]
    return {"model": "gpt-4o", "messages": msgs}


def _hoisted(body: dict) -> dict:
    """What the hoist pass sends: the clock line out of the system text, in a note at the end."""
    sys_text = body["messages"][0]["content"]
    kept = "\n".join(line for line in sys_text.split("\n") if not line.startswith("Current time"))
    clock = next(line for line in sys_text.split("\n") if line.startswith("Current time"))
    return {**body, "messages": [{"role": "system", "content": kept}, *body["messages"][1:],
                                 {"role": "user", "content": f"[note 1] {clock}"}]}


def test_a_clock_in_the_clients_system_prompt_is_named_by_its_masked_line() -> None:
    cb = ClientBreaks()
    first = _body(_system("22:31:05"), 1)
    assert cb.observe("s", first, first, wc) is None  # a session's first request is no break
    second = _body(_system("22:31:41"), 2)
    rec = cb.observe("s", second, second, wc)
    assert rec is not None and rec.kind == "volatile_span" and rec.region == "system"
    assert rec.excerpt == "Current time: \u27e8datetime\u27e9" and rec.line == 2
    assert rec.unit == "estimate" and rec.tokens_lost > 200
    assert not any(ch.isdigit() for ch in rec.to_dict()["excerpt"])


def test_prefixgates_own_rewrite_is_never_the_clients_break() -> None:
    cb = ClientBreaks()
    body1 = _body(_system("22:31:05"), 1)
    cb.observe("s", body1, body1, wc)  # sent as is: the guard had not seen the clock change yet
    body2 = _body(_system("22:31:41"), 2)
    # turn 2: the client's clock broke the prefix AND the hoist moved it: the client's cause
    rec = cb.observe("s", body2, _hoisted(body2), wc)
    assert rec is not None and rec.kind == "volatile_span" and rec.excerpt.startswith("Current")
    # turn 3 on: the hoisted bodies extend each other; the client's break cost nothing
    body3 = _body(_system("22:32:10"), 3)
    assert cb.observe("s", body3, _hoisted(body3), wc) is None
    # a divergence only the rewrite made (the client's body extends the previous one)
    cb2 = ClientBreaks()
    a = _body(_system("22:31:05"), 1)
    cb2.observe("t", a, a, wc)
    b = _body(_system("22:31:05"), 2)
    assert cb2.observe("t", b, _hoisted(b), wc) is None


def test_the_backends_own_ids_decide_and_give_the_offset() -> None:
    cb = ClientBreaks()
    body1, body2 = _body(_system("22:31:05"), 1), _body(_system("22:31:41"), 2)
    ids1 = list(range(100, 400))
    ids2 = ids1[:37] + [7] + list(range(500, 900))
    cb.observe("s", body1, body1, wc, sent_ids=ids1)
    rec = cb.observe("s", body2, body2, wc, sent_ids=ids2)
    assert rec is not None and rec.unit == "engine"
    assert rec.token_offset == 37 and rec.tokens_lost == len(ids1) - 37
    # the blocks differ but the rendered ids extend the previous ones: no break for this backend
    body3 = _body(_system("22:32:10"), 3)
    assert cb.observe("s", body3, body3, wc, sent_ids=ids2 + [1, 2, 3]) is None


def test_a_one_shot_request_after_another_is_no_break() -> None:
    det = BreakDetector()
    a = {"model": "m", "messages": [{"role": "user", "content": "Say hello"}]}
    b = {"model": "m", "messages": [{"content": "Say hello", "role": "user"}]}  # another SDK
    assert det.observe("s", a, wc) is None and det.observe("s", b, wc) is None
    # a continuation whose first question was edited (the previous request had an answer) is
    c = {"model": "m", "messages": [a["messages"][0], {"role": "assistant", "content": "Hi"},
                                    {"role": "user", "content": "And now? " + words(30)}]}
    det.observe("u", c, wc)
    e = {"model": "m", "messages": [{"role": "user", "content": "Say hi"}, *c["messages"][1:]]}
    rec = det.observe("u", e, wc)
    assert rec is not None and rec.kind == "history_edit"


def test_masked_excerpts_hold_no_digit_and_stay_short() -> None:
    line = "Order 12345 for +1 555 0100 at 2026-12-06 22:31:05 " + "x" * 200
    text, number = masked_excerpt("head\n" + line + "\ntail", 5 + line.index("22:31"))
    assert number == 2 and len(text) <= 60 and not any(ch.isdigit() for ch in text)
    assert "\u27e8datetime\u27e9" in text


def test_stored_records_read_back_whatever_keys_the_ledger_added() -> None:
    rec = BreakRecord("s", 1, "volatile_span", "system", 0, 0, 1, 10, 20, "d", ("time",),
                      excerpt="Now: \u27e8time\u27e9", line=2, unit="engine")
    back = BreakRecord.from_dict({**rec.to_dict(), "route": "r", "backend": "b"})
    assert back == rec
    old = {k: v for k, v in rec.to_dict().items() if k not in ("excerpt", "line", "unit")}
    assert BreakRecord.from_dict(old).unit == "estimate"


def test_shared_ids_counts_the_common_prefix() -> None:
    assert shared_ids([1, 2, 3], [1, 2, 4]) == 2
    assert shared_ids(list(range(1000)), list(range(1000))) == 1000
    assert shared_ids(list(range(1000)), [*range(600), 0]) == 600


def test_the_breaks_table_shows_the_masked_line_and_the_unit() -> None:
    from prefixgate.cache.savings.breaks import format_breaks

    rec = BreakRecord("s", 1, "volatile_span", "system", 0, 0, 1, 31, 900, "system[0] differs",
                      ("datetime",), excerpt="Current time: \u27e8datetime\u27e9", line=2,
                      unit="engine")
    text = format_breaks([rec])
    assert 'line 2: "Current time: \u27e8datetime\u27e9"' in text
    assert "in the backend's own tokens, from the start of the prompt" in " ".join(text.split())
