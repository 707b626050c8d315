"""A memoized pass reads nothing that is not in its memo key (:mod:`prefixgate.rewriter.region_memo`).

The rule: a result kept by :class:`RegionMemo` may be handed out again only when every input
the pass reads is part of the key (the tools' bytes, the settings and session keys its
``PassSpec.reads`` names, the token counter). Two checks, on every pass that declares ``reads``:

- what it reads: the pass runs on a context that records each attribute, setting and session
  key asked for, and on a prompt whose system, messages and params record any look inside
  them; nothing outside its declaration may be read (a read on any path exercised here fails);
- what it gives: one memo, the same tools, a first request under one value of an input and a
  second under another value, for every ``RewriteSettings`` field, every ``Context`` field,
  every session key the passes write, and the rest of the body; the second request must give
  what it gives without a memo (bytes, Edits, hash, stages). A field added to ``Context`` or
  ``RewriteSettings`` without a second value here fails the test that lists them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import fields, replace
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.core import exactjson
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.pipeline import PASSES, rewrite_request, session_updates
from prefixgate.rewriter.region_memo import RegionMemo, TailFree
from prefixgate.rewriter.token_memo import TokenMemo
from prefixgate.rewriter.types import Context, Edit, RewriteResult
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Prompt
from tests.trace_requests import tau_requests

RUN = tau_requests(runs=1)[0][:4]
COUNTER = TokenMemo(count_tokens)
MEMOIZED = [spec for spec in PASSES if spec.reads is not None]

SETTING_ALTERNATIVES: dict[str, Any] = {
    "enabled": False, "canonicalize_tools": False, "tool_order": "name",
    "tool_schema_sort_properties": True, "hoist_volatile": True, "hoist_target": "last_user",
    "learn_volatility": False, "stabilise_passages": True, "place_breakpoints": False,
    "breakpoint_ttl": "1h", "openai_prompt_cache_key": False, "cache_diagnostics": True,
    "openai_prompt_cache_retention": "24h", "tenant": "other", "prune_tools": True,
    "prune_tools_min_catalog": 2, "pinned_tools": ["book_reservation"], "prune_history": True,
    "history_high_watermark_tokens": 400, "history_low_watermark_tokens": 1,
    "prune_rag": True, "rag_budget_tokens": 1, "rag_delimiters": ["\n\n"],
    "time_budget_ms": 600_000, "edit_detail_header": True, "stand_back": False,
    "stand_back_min_requests": 2, "stand_back_s": 1.0,
}
"""A second value for every ``RewriteSettings`` field (the base is each field's default)."""


def _other_counter(text: str) -> int:
    return len(text) // 3 + 1


CONTEXT_ALTERNATIVES: dict[str, Any] = {
    "model": "claude-sonnet-4-5", "provider": "anthropic", "session_id": "another",
    "count_tokens": _other_counter, "betas": ("extended-cache-ttl-2025-04-11",),
    "now_s": 1_900_000_000.0, "masks_tools": True, "deadline": 1e18,
}
"""A second value for every ``Context`` field but ``settings`` / ``session`` (varied apart)
and ``memo`` (the thing under test)."""


def test_every_input_has_a_second_value() -> None:
    assert set(SETTING_ALTERNATIVES) == set(RewriteSettings.model_fields)
    assert set(CONTEXT_ALTERNATIVES) | {"settings", "session", "memo"} == \
        {f.name for f in fields(Context)}
    assert MEMOIZED, "no pass declares reads: nothing here tests the memo"


def _shuffled(body: dict[str, Any], seed: int) -> dict[str, Any]:
    """``body`` with its tools in another order and one tool's keys reversed (same values)."""
    tools = list(body["tools"])
    random.Random(seed).shuffle(tools)
    fn = tools[1]["function"]
    tools[1] = {**tools[1], "function": dict(reversed(list(fn.items())))}
    return {**body, "tools": tools}


def _view(res: RewriteResult) -> tuple[Any, ...]:
    stages = [(n, exactjson.dumps(wire.render(p)), a) for n, p, a in res.stages]
    return (exactjson.dumps(res.body), res.edits, res.stable_prefix_hash, stages)


def _memory(switches: dict[str, Any]) -> dict[str, Any]:
    """The session memory after the run's first three turns, every pass writing its keys."""
    memory: dict[str, Any] = {}
    for k, body in enumerate(RUN[:3]):
        ctx = Context(settings=RewriteSettings(**switches), model="gpt-4o", provider="anthropic",
                      session_id="s", session=MappingProxyType(dict(memory)),
                      now_s=1_800_000_000.0 + 40 * k, count_tokens=COUNTER)
        memory.update(session_updates(rewrite_request(_shuffled(body, k), "openai", ctx)))
    return memory


ALL_ON = {"hoist_volatile": True, "stabilise_passages": True, "prune_tools": True,
          "prune_history": True, "prune_rag": True, "openai_prompt_cache_key": True}
BASES = [{}, {"tool_order": "name"}, ALL_ON]


def _base(switches: dict[str, Any], memo: RegionMemo | None) -> Context:
    return Context(settings=RewriteSettings(**switches), model="gpt-4o", provider="openai",
                   session_id="s", session=MappingProxyType(_memory(switches)),
                   now_s=1_800_000_200.0, count_tokens=COUNTER, memo=memo)


def _stale_free(body_a: dict[str, Any], a: Context, body_b: dict[str, Any], b: Context) -> None:
    """``b`` after ``a`` on one memo gives what ``b`` gives without one (and the other way)."""
    for (x, cx), (y, cy) in (((body_a, a), (body_b, b)), ((body_b, b), (body_a, a))):
        memo = RegionMemo()
        rewrite_request(x, "openai", replace(cx, memo=memo))
        got = _view(rewrite_request(y, "openai", replace(cy, memo=memo)))
        assert got == _view(rewrite_request(y, "openai", replace(cy, memo=None)))


def _settings_with(base: RewriteSettings, field: str, value: Any) -> RewriteSettings:
    data = base.model_dump()
    data[field] = value
    if field == "history_high_watermark_tokens":
        data["history_low_watermark_tokens"] = 1
    return RewriteSettings(**data)


@pytest.mark.parametrize("switches", BASES, ids=["defaults", "by_name", "all_on"])
@pytest.mark.parametrize("field", sorted(SETTING_ALTERNATIVES))
def test_a_setting_changed_between_requests_never_reuses_a_stale_result(
        switches: dict[str, Any], field: str) -> None:
    a = _base(switches, None)
    b = replace(a, settings=_settings_with(a.settings, field, SETTING_ALTERNATIVES[field]))
    body = _shuffled(RUN[3], 11)
    _stale_free(body, a, body, b)


@pytest.mark.parametrize("switches", BASES, ids=["defaults", "by_name", "all_on"])
@pytest.mark.parametrize("field", sorted(CONTEXT_ALTERNATIVES))
def test_a_context_field_changed_between_requests_never_reuses_a_stale_result(
        switches: dict[str, Any], field: str) -> None:
    a = _base(switches, None)
    b = replace(a, **{field: CONTEXT_ALTERNATIVES[field]})
    body = _shuffled(RUN[3], 11)
    _stale_free(body, a, body, b)


@pytest.mark.parametrize("switches", BASES, ids=["defaults", "by_name", "all_on"])
def test_session_memory_changed_between_requests_never_reuses_a_stale_result(
        switches: dict[str, Any]) -> None:
    a = _base(switches, None)
    memory = {**_memory({}), **a.session}  # first-seen keys too where the base writes none
    assert {"tool_order", "tool_forms"} <= set(memory)
    variants = [{k: v for k, v in memory.items() if k != drop} for drop in memory]
    variants.append({**memory, "tool_order": list(reversed(memory["tool_order"]))})
    variants.append({})
    body = _shuffled(RUN[3], 11)
    for variant in variants:
        _stale_free(body, a, body, replace(a, session=MappingProxyType(variant)))


@pytest.mark.parametrize("switches", BASES, ids=["defaults", "by_name", "all_on"])
def test_the_rest_of_the_body_changed_never_reuses_a_stale_result(
        switches: dict[str, Any]) -> None:
    """Same tool bytes, another conversation, system text or parameters."""
    a = _base(switches, None)
    body = _shuffled(RUN[3], 11)
    others = [
        {**body, "messages": RUN[1]["messages"]},
        {**body, "messages": [{"role": "system", "content": "Other rules."},
                              *body["messages"][1:]]},
        {**body, "model": "gpt-4o-mini", "temperature": 0, "tool_choice": "auto"},
        {"tools": body["tools"], **{k: v for k, v in body.items() if k != "tools"}},
    ]
    for other in others:
        _stale_free(body, a, other, a)


# -- what a memoized pass reads ---------------------------------------------------------------

class _Seen:
    """Names read, by kind: ``ctx`` attributes, ``settings`` fields, ``session`` keys
    (``*`` for a walk over all of them) and ``prompt`` parts looked inside."""

    def __init__(self) -> None:
        self.ctx: set[str] = set()
        self.settings: set[str] = set()
        self.session: set[str] = set()
        self.prompt: set[str] = set()


class _SettingsView:
    def __init__(self, real: RewriteSettings, seen: _Seen) -> None:
        self._real, self._seen = real, seen

    def __getattr__(self, name: str) -> Any:
        self._seen.settings.add(name)
        return getattr(self._real, name)


class _SessionView(Mapping[str, Any]):
    def __init__(self, real: Mapping[str, Any], seen: _Seen) -> None:
        self._real, self._seen = real, seen

    def __getitem__(self, key: str) -> Any:
        self._seen.session.add(key)
        return self._real[key]

    def __contains__(self, key: object) -> bool:
        self._seen.session.add(str(key))
        return key in self._real

    def get(self, key: str, default: Any = None) -> Any:
        self._seen.session.add(key)
        return self._real.get(key, default)

    def __iter__(self) -> Iterator[str]:
        self._seen.session.add("*")
        return iter(self._real)

    def __len__(self) -> int:
        self._seen.session.add("*")
        return len(self._real)


def _watched_tuple(part: str, seen: _Seen) -> type:
    class Watched(tuple):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[Any]:
            seen.prompt.add(part)
            return super().__iter__()

        def __len__(self) -> int:
            seen.prompt.add(part)
            return super().__len__()

        def __getitem__(self, i: Any) -> Any:
            seen.prompt.add(part)
            return super().__getitem__(i)

        def __bool__(self) -> bool:
            seen.prompt.add(part)
            return super().__len__() > 0
    return Watched


def _watched_dict(part: str, seen: _Seen) -> type:
    class Watched(dict):  # type: ignore[type-arg]
        def __getitem__(self, k: Any) -> Any:
            seen.prompt.add(part)
            return super().__getitem__(k)

        def get(self, k: Any, default: Any = None) -> Any:
            seen.prompt.add(part)
            return super().get(k, default)

        def __iter__(self) -> Iterator[Any]:
            seen.prompt.add(part)
            return super().__iter__()

        def __contains__(self, k: object) -> bool:
            seen.prompt.add(part)
            return super().__contains__(k)

        def __len__(self) -> int:
            seen.prompt.add(part)
            return super().__len__()
    return Watched


def _watched(ctx: Context, prompt: Prompt, seen: _Seen) -> tuple[Context, Prompt]:
    class WatchedContext(Context):
        def __getattribute__(self, name: str) -> Any:
            if not name.startswith("_"):
                seen.ctx.add(name)
            return super().__getattribute__(name)

    values = {f.name: getattr(ctx, f.name) for f in fields(Context)}
    values["settings"] = _SettingsView(ctx.settings, seen)
    values["session"] = _SessionView(ctx.session, seen)
    watched = replace(prompt, system=_watched_tuple("system", seen)(prompt.system),
                      messages=_watched_tuple("messages", seen)(prompt.messages),
                      params=_watched_dict("params", seen)(prompt.params))
    return WatchedContext(**values), watched


def _reads_within(reads: TailFree, seen: _Seen) -> list[str]:
    out = [f"ctx.{n}" for n in seen.ctx - {"settings", "session", "count_tokens"}]
    out += [f"settings.{n}" for n in seen.settings - set(reads.settings)]
    out += [f"session[{n}]" for n in seen.session - set(reads.session)]
    out += [f"prompt.{n}" for n in seen.prompt]
    return sorted(out)


@pytest.mark.parametrize("spec", MEMOIZED, ids=[s.name for s in MEMOIZED])
@pytest.mark.parametrize("switches", [*BASES, {"tool_schema_sort_properties": True}],
                         ids=["defaults", "by_name", "all_on", "sort_props"])
def test_a_memoized_pass_reads_only_what_its_key_names(spec: Any, switches: dict[str, Any]
                                                       ) -> None:
    assert spec.fn is not None and spec.reads is not None
    for session in (_memory(switches), {}):
        for body in (_shuffled(RUN[3], 5), RUN[3], {**RUN[3], "tools": []},
                     {**RUN[3], "tools": [{"type": "function", "function": {}}]}):
            seen = _Seen()
            ctx, prompt = _watched(replace(_base(switches, None),
                                           session=MappingProxyType(session)),
                                   wire.parse(body, "openai"), seen)
            spec.fn(prompt, ctx)
            assert _reads_within(spec.reads, seen) == [], spec.name


# -- values whose JSON text does not tell them apart ------------------------------------------

def test_a_session_value_orjson_writes_like_another_is_no_key() -> None:
    """A tuple of the session's tool names is written like the list, but the pass tells them
    apart (it proposes ``tool_order`` again): the memo must not hand one the other's Edits."""
    a = _base({}, None)
    b = replace(a, session=MappingProxyType({**a.session,
                                             "tool_order": tuple(a.session["tool_order"])}))
    body = _shuffled(RUN[3], 11)
    _stale_free(body, a, body, b)


def _reads_a_list(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Any]]:
    return prompt, [Edit("pinned", False, "tools", ",".join(ctx.settings.pinned_tools))]


def test_a_list_setting_in_the_reads_is_part_of_the_key() -> None:
    """A setting whose value is a list (unhashable) is keyed by its JSON, not refused."""
    reads = TailFree(settings=("pinned_tools",), session=())
    memo = RegionMemo()
    prompt = wire.parse(RUN[3], "openai")
    for pinned in (["a"], ["b"], ["a"]):
        ctx = replace(_base({}, memo), settings=RewriteSettings(pinned_tools=pinned))
        _, edits = memo.run_pass("pinned", _reads_a_list, reads, prompt, ctx)
        assert [e.detail for e in edits] == [pinned[0]]
    assert (memo.hits, memo.misses) == (1, 2)


def _remembers_a_tuple(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Any]]:
    return prompt, [Edit("tuple", False, "tools", "", memory={"names": ("a", "b")})]


def test_an_edit_whose_memory_json_cannot_give_back_is_not_stored() -> None:
    memo = RegionMemo()
    prompt = wire.parse(RUN[3], "openai")
    for _ in range(2):
        _, edits = memo.run_pass("tuple", _remembers_a_tuple, TailFree((), ()), prompt,
                                 _base({}, memo))
        assert edits[0].memory == {"names": ("a", "b")}
    assert len(memo) == 0


# -- conversations edited in the middle -------------------------------------------------------

def _edit_message(body: dict[str, Any], at: int, text: str) -> dict[str, Any]:
    """``body`` with one message's text changed (the system message included: index 0)."""
    messages = list(body["messages"])
    i = at % len(messages)
    m = dict(messages[i])
    if isinstance(m.get("content"), str):
        m["content"] = m["content"] + text
    else:
        m["content"] = text
    messages[i] = m
    return {**body, "messages": messages}


@settings(max_examples=20, deadline=None)
@given(turns=st.integers(2, 4),
       change=st.lists(st.tuples(st.sampled_from(["message", "drop_tail", "same", "tools"]),
                                 st.integers(0, 60), st.text(min_size=1, max_size=12)),
                       min_size=4, max_size=4),
       switches=st.sampled_from(BASES), provider=st.sampled_from(["openai", "anthropic"]))
def test_a_conversation_edited_in_the_middle_gives_the_full_rewrites_bytes(
        turns: int, change: list[tuple[str, int, str]], switches: dict[str, Any],
        provider: str) -> None:
    """Messages (system text included) edited, the tail dropped, tools reordered, turn by
    turn in one session: memo on and off give the same results, turn after turn."""
    bodies = []
    for body, (kind, at, text) in zip(RUN[:turns], change):
        if kind == "message":
            body = _edit_message(body, at, text)
        elif kind == "drop_tail":
            body = {**body, "messages": body["messages"][:max(1, at % len(body["messages"]))]}
        elif kind == "tools":
            body = _shuffled(body, at)
        bodies.append(body)

    def session(memo: RegionMemo | None) -> list[tuple[Any, ...]]:
        memory: dict[str, Any] = {}
        out = []
        for k, body in enumerate(bodies):
            ctx = Context(settings=RewriteSettings(**switches), model="gpt-4o",
                          provider=provider, session_id="s",
                          session=MappingProxyType(dict(memory)),
                          now_s=1_800_000_000.0 + 30 * k, count_tokens=COUNTER, memo=memo)
            res = rewrite_request(body, "openai", ctx)
            memory.update(session_updates(res))
            out.append(_view(res))
        return out

    memo = RegionMemo()
    session(memo)  # the memo now holds every turn's entries: the rerun hits them
    assert session(memo) == session(None)
