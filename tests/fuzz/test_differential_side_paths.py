"""The differential fuzzer on the paths beyond chat (issue 20, tests): the Responses endpoint
(bridged to Chat and to Messages, and passed through to a backend that serves it), the fan-out
gate, and count_tokens. Same seeded hostile bodies as :mod:`tests.fuzz.test_differential`;
each exchange is checked for: no 5xx, errors in the caller's shape naming the param, answers in
the caller's shape, a valid upstream body, and (count_tokens) no ledger row.

``PREFIXGATE_FUZZ_SIDE_BODIES`` bodies per test (default 600: the CI run; the chat fuzzer is the
10,000-body one).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.check import PATHS, _error_checks, check_exchange, loads, make_case
from tests.fuzz.harness import FuzzRig
from tests.fuzz.known_defects import uncovered
from tests.fuzz.shapes import error_problems, request_problems

BODIES = int(os.environ.get("PREFIXGATE_FUZZ_SIDE_BODIES", "600"))
PER_EXAMPLE = 10


def _rig(**extra: Any) -> Iterator[FuzzRig]:
    logging.disable(logging.ERROR)
    try:
        with FuzzRig(**extra) as r:
            yield r
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def rig() -> Iterator[FuzzRig]:
    yield from _rig()


@pytest.fixture(scope="module")
def gated() -> Iterator[FuzzRig]:
    yield from _rig(fanout={"enabled": True, "providers": ["radix", "openai", "anthropic"],
                            "min_prefix_bytes": 0, "max_hold_ms": 5})


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _seeds(fn: Any) -> None:
    settings(max_examples=max(1, BODIES // PER_EXAMPLE), phases=(Phase.explicit, Phase.generate),
             deadline=None)(given(seed=st.integers(0, 2**31 - 1))(fn))()


def test_the_fanout_gate_keeps_every_invariant(gated: FuzzRig) -> None:
    """The chat fuzzer's five paths with the fan-out gate on (integers beyond 64 bits in the
    keyed prefix were a 500 there)."""
    def one(seed: int) -> None:
        problems: list[str] = []
        for k in range(PER_EXAMPLE):
            case = make_case(seed * PER_EXAMPLE + k, k)
            before, _ = gated.ledger_state()
            ex = gated.send(case.api, case.raw, {"x-prefixgate-session": case.session, **case.headers})
            rows, status = gated.ledger_state()
            found = check_exchange(case, ex, (rows - before, status or 0))
            problems += [f"seed={seed} {case.path}: {v.kind}: {v.detail}"
                         for v in uncovered(case.path, found, case.raw)]
        assert not problems, "\n".join(problems[:10])
    _seeds(one)


def _responses_body(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """A Responses request carrying a generated Chat body's conversation and tools (hostile
    parts kept as they are: the bridge must refuse what it cannot carry)."""
    items: list[Any] = []
    for m in chat.get("messages") if isinstance(chat.get("messages"), list) else []:
        if not isinstance(m, dict):
            items.append(m)
            continue
        if m.get("role") == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                          "output": m.get("content")})
            continue
        for c in m.get("tool_calls") or [] if isinstance(m.get("tool_calls"), list) else []:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict):
                items.append({"type": "function_call", "call_id": c.get("id"), "name": fn.get("name"),
                              "arguments": fn.get("arguments")})
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "input_text", "text": p.get("text")} if isinstance(p, dict)
                       and p.get("type") == "text" else p for p in content]
        if content is not None:
            items.append({"role": m.get("role"), "content": content})
    body: dict[str, Any] = {"model": model, "input": items or "hi"}
    tools = chat.get("tools")
    if isinstance(tools, list):
        body["tools"] = [{"type": "function", **t["function"]} if isinstance(t, dict) and isinstance(
            t.get("function"), dict) else t for t in tools]
    for src, dst in (("stream", "stream"), ("temperature", "temperature"), ("max_tokens", "max_output_tokens")):
        if src in chat:
            body[dst] = chat[src]
    return body


RESPONSES_MODELS = ("gpt-fuzz", "claude-fuzz", "gpt-4o-fuzz")  # bridged, over O->A, native


def _responses_problems(rig: FuzzRig, seed: int, model: str) -> list[str]:
    case = make_case(seed, 0)  # an OpenAI-client body
    body = _responses_body(case.body, model)
    raw = json.dumps(body).encode()
    ex = rig.send("openai", raw, {"x-prefixgate-session": case.session}, path="/v1/responses")
    out: list[str] = []
    doc = _json(ex.body)
    if ex.status >= 500:
        out.append(f"5xx {ex.status}: {ex.body[:200]!r}")
    elif ex.status >= 400:
        out += error_problems(ex.status, doc, "openai")
    elif body.get("stream") is True:
        text = ex.body.decode("utf-8", "replace")
        if "response.completed" not in text or "event: error" in text or "response.failed" in text:
            out.append("stream_not_finished")
    elif not (isinstance(doc, dict) and doc.get("object") == "response" and isinstance(doc.get("output"), list)):
        out.append("answer_not_a_response")
    for sent in ex.sent:
        if sent.api == "responses":  # passed through: the conversation as the client sent it
            sent_doc = _json(sent.body)
            if not isinstance(sent_doc, dict) or sent_doc.get("input") != body["input"]:
                out.append("native_input_changed")
        else:  # bridged: valid for the backend's API (numbers read exactly, as the checkers do)
            out += [f"upstream_{p}" for p in request_problems(loads(sent.body), sent.api)]
    return [f"seed={seed} responses->{model}: {p}" for p in out]


def test_the_responses_endpoint_keeps_every_invariant(rig: FuzzRig) -> None:
    answered: dict[str, int] = {}

    def one(seed: int) -> None:
        problems: list[str] = []
        for k in range(PER_EXAMPLE):
            model = RESPONSES_MODELS[k % len(RESPONSES_MODELS)]
            before = len(problems)
            problems += _responses_problems(rig, seed * PER_EXAMPLE + k, model)
            if len(problems) == before:
                answered[model] = answered.get(model, 0) + 1
        assert not problems, "\n".join(problems[:10])
    _seeds(one)
    assert all(answered.get(m, 0) > 0 for m in RESPONSES_MODELS), answered


def test_count_tokens_keeps_every_invariant(rig: FuzzRig) -> None:
    """Anthropic-client bodies on count_tokens: to Anthropic (identity), to a compat engine
    (``/tokenize`` 404 here: estimated) — an integer count or an Anthropic-shaped error, never a
    5xx, never a ledger row."""
    anthropic_paths = [i for i, (api, _) in enumerate(PATHS) if api == "anthropic"]

    def one(seed: int) -> None:
        problems: list[str] = []
        for k in range(PER_EXAMPLE):
            case = make_case(seed * PER_EXAMPLE + k, anthropic_paths[k % len(anthropic_paths)])
            before, _ = rig.ledger_state()
            ex = rig.send("anthropic", case.raw, dict(case.headers), path="/v1/messages/count_tokens")
            rows, _ = rig.ledger_state()
            doc = _json(ex.body)
            if rows != before:
                problems.append(f"seed={seed}: count_tokens wrote a ledger row")
            if ex.status >= 500:
                problems.append(f"seed={seed}: 5xx {ex.status} {ex.body[:200]!r}")
            elif ex.status >= 400:
                problems += [f"seed={seed}: {v.kind}" for v in _error_checks(case, ex)]
            elif not (isinstance(doc, dict) and isinstance(doc.get("input_tokens"), int)
                      and doc["input_tokens"] >= 0):
                problems.append(f"seed={seed}: not a count: {ex.body[:120]!r}")
        assert not problems, "\n".join(problems[:10])
    _seeds(one)


PD_FIELDS: tuple[tuple[str, Any], ...] = (
    ("kv_transfer_params", {"do_remote_prefill": True, "transfer_id": 4611686018427387904}),
    ("kv_transfer_params", {"do_remote_prefill": True, "transfer_id": 0,
                            "first_token_ids": [39, 3791, 276]}),
    ("kv_transfer_params", {"do_remote_decode": True}),
    ("kv_transfer_params", None), ("kv_transfer_params", "x"),
    ("first_token_ids", [1, 2]), ("bootstrap_host", "10.1.2.3"), ("bootstrap_port", 8998),
    ("bootstrap_room", 2**62), ("bootstrap_anything", {"a": 1}),
)
"""The P/D contract fields (vLLM's ``kv_transfer_params`` and its ``first_token_ids``, SGLang's
``bootstrap_*``), with the values a hostile client would send (issue 34, items 2 and 12)."""


def test_pd_contract_fields_from_a_client_are_refused_on_every_path(rig: FuzzRig) -> None:
    """The chat fuzzer's valid bodies on all five paths with one P/D contract field added first
    or last: a 400 in the caller's shape naming the field, no upstream request, one ledger row."""
    def one(seed: int) -> None:
        problems: list[str] = []
        for k in range(PER_EXAMPLE):
            case = make_case(seed * PER_EXAMPLE + k, k)
            if not case.valid:  # a hostile body has its own 400 (bad JSON, a wrong type) first
                continue
            r = random.Random(seed * PER_EXAMPLE + k)
            key, value = r.choice(PD_FIELDS)
            field = b'"' + key.encode() + b'":' + orjson.dumps(value)
            if r.random() < 0.5:  # first or last: the bodies' own bytes stay as generated
                raw = case.raw.replace(b"{", b"{" + field + b",", 1)
            else:
                end = case.raw.rstrip().rfind(b"}")
                raw = case.raw[:end] + b"," + field + case.raw[end:]
            before, _ = rig.ledger_state()
            ex = rig.send(case.api, raw, {"x-prefixgate-session": case.session})
            rows, status = rig.ledger_state()
            if ex.sent and any(key.encode() in s.body for s in ex.sent):
                problems.append(f"seed={seed} {case.path}: {key!r} reached the upstream")
            if ex.status != 400:
                problems.append(f"seed={seed} {case.path}: {key!r} answered {ex.status}")
                continue
            problems += [f"seed={seed} {case.path}: {p}" for p in
                         error_problems(ex.status, _json(ex.body), case.api)]
            if key not in ex.body.decode("utf-8", "replace") or (rows - before, status) != (1, 400):
                problems.append(f"seed={seed} {case.path}: the error or record does not name "
                                f"{key!r}: {ex.body[:160]!r} rows {rows - before}")
        assert not problems, "\n".join(problems[:10])
    _seeds(one)
