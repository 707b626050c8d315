"""Property tests over both bridges (issue 8, *Translation is lossless or refuses*).

For generated bodies (valid, unsupported and ill-typed fields mixed), ``bridging.request``
either refuses with a 400 whose ``param`` names a place in the client's body, or returns a body
in which every piece of client content is accounted for: every text the client wrote (and every
key and string of its tool inputs) is in the translated body, mapped or between delimiters, and
every number keeps its exact JSON text. No other exception, and the result serialises.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import InvalidRequest
from prefixgate.proxy.core.usage import AnthropicStreamWatcher, OpenAIStreamWatcher
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.types import Context
from tests.proxy import bridging

# Keys whose string values are tags or switches the bridge consumes (mapped to structure, or
# hints documented as such in docs/bridges.md), not content the client wrote.
CONSUMED = {"type", "role", "detail", "service_tier", "tool_choice", "function_call",
            "prompt_cache_key", "prompt_cache_retention", "cache_control", "model",
            "n", "frequency_penalty", "presence_penalty", "top_logprobs"}  # only defaults pass

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
WORD = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
NUMBER = st.sampled_from(["1", "-0", "1.10", "1e5", "0.7", "123456789012345678901234567890",
                          "2.50e-3", "18446744073709551616"]).map(exactjson.loads)
JUNK = st.one_of(st.integers(-3, 3), TEXT, st.none(), st.booleans(), st.lists(st.integers(),
                                                                             max_size=2))
TOOL_INPUT = st.dictionaries(WORD, st.one_of(TEXT, NUMBER, st.booleans()), max_size=3)


def maybe(d: dict[str, Any], key: str, strat: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(d), strat.map(lambda v: {**d, key: v}))


def fixed(**kw: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(kw)


# --- Anthropic bodies ------------------------------------------------------------------------

A_TEXT = fixed(type=st.just("text"), text=TEXT).flatmap(
    lambda b: maybe(b, "cache_control", st.just({"type": "ephemeral"})))
A_IMAGE = fixed(type=st.just("image"), source=st.one_of(
    fixed(type=st.just("base64"), media_type=st.just("image/png"), data=WORD),
    fixed(type=st.just("url"), url=WORD), fixed(type=st.just("file"), file_id=WORD)))
A_DOC = fixed(type=st.just("document"), source=st.one_of(
    fixed(type=st.just("text"), media_type=st.just("text/plain"), data=TEXT),
    fixed(type=st.just("content"), content=st.lists(A_TEXT, max_size=2)),
    fixed(type=st.just("base64"), media_type=st.just("application/pdf"), data=WORD),
    fixed(type=st.just("url"), url=WORD))).flatmap(
    lambda b: maybe(b, "title", TEXT)).flatmap(lambda b: maybe(b, "context", TEXT)).flatmap(
    lambda b: maybe(b, "citations", fixed(enabled=st.booleans())))
A_SEARCH = fixed(type=st.just("search_result"), source=TEXT, title=TEXT,
                 content=st.lists(A_TEXT, max_size=2))
A_TOOL_RESULT = fixed(type=st.just("tool_result"), tool_use_id=WORD, content=st.one_of(
    TEXT, st.lists(st.one_of(A_TEXT, A_IMAGE, A_DOC, A_SEARCH), max_size=2))).flatmap(
    lambda b: maybe(b, "is_error", st.booleans()))
A_TOOL_USE = fixed(type=st.just("tool_use"), id=WORD, name=WORD, input=TOOL_INPUT)
A_ODD = st.one_of(fixed(type=st.sampled_from(["thinking", "server_tool_use", "x"])), JUNK,
                  fixed(type=st.just("text"), text=TEXT, weight=JUNK))
A_USER = st.one_of(TEXT, st.lists(st.one_of(A_TOOL_RESULT, A_TEXT, A_IMAGE, A_DOC, A_SEARCH,
                                            A_ODD), max_size=4))
A_ASSISTANT = st.one_of(TEXT, st.lists(st.one_of(A_TEXT, A_TOOL_USE, A_ODD), max_size=3))
A_MESSAGE = st.one_of(fixed(role=st.just("user"), content=A_USER),
                      fixed(role=st.just("assistant"), content=A_ASSISTANT),
                      fixed(role=st.sampled_from(["system", "tool"]), content=TEXT))
A_TOOL = fixed(name=WORD, description=TEXT, input_schema=st.just({"type": "object"})).flatmap(
    lambda t: maybe(t, "type", st.sampled_from(["custom", "web_search_20250305"])))
A_EXTRA = st.fixed_dictionaries({}, optional={
    "system": st.one_of(TEXT, st.lists(A_TEXT, max_size=2), JUNK),
    "temperature": st.one_of(NUMBER, JUNK), "top_p": NUMBER, "top_k": st.one_of(NUMBER, JUNK),
    "stop_sequences": st.one_of(st.lists(TEXT, max_size=2), JUNK),
    "metadata": st.one_of(fixed(user_id=TEXT), JUNK),
    "tools": st.one_of(st.lists(A_TOOL, max_size=2), JUNK),
    "tool_choice": st.one_of(fixed(type=st.sampled_from(["auto", "any", "none", "x"])),
                             fixed(type=st.just("tool"), name=WORD), JUNK),
    "thinking": st.one_of(fixed(type=st.sampled_from(["enabled", "disabled"])), JUNK),
    "stream": st.one_of(st.booleans(), JUNK), "service_tier": st.one_of(TEXT, JUNK),
    "container": JUNK, "mcp_servers": JUNK, "surprise": JUNK, "cache_control": JUNK})
A_BODY = st.tuples(st.lists(A_MESSAGE, min_size=1, max_size=4), NUMBER, A_EXTRA).map(
    lambda t: {"model": "m", "max_tokens": t[1], "messages": t[0], **t[2]})
A_MESSAGE_OK = st.one_of(
    fixed(role=st.just("user"), content=st.one_of(TEXT, st.lists(st.one_of(
        A_TEXT, A_IMAGE, A_DOC, A_SEARCH), max_size=4)).map(
        lambda c: c if isinstance(c, str) else [b for b in c if b.get("citations") is None]))
    .flatmap(lambda m: st.lists(A_TOOL_RESULT, max_size=2).map(
        lambda trs: {**m, "content": trs + (m["content"] if isinstance(m["content"], list)
                                            else [{"type": "text", "text": m["content"]}])})),
    fixed(role=st.just("assistant"), content=st.one_of(TEXT, st.tuples(
        st.lists(A_TEXT, max_size=2), st.lists(A_TOOL_USE, max_size=2)).map(
        lambda t: t[0] + t[1]))))
A_EXTRA_OK = st.fixed_dictionaries({}, optional={
    "system": st.one_of(TEXT, st.lists(A_TEXT, max_size=2)), "temperature": NUMBER,
    "top_k": st.integers(1, 50), "stop_sequences": st.lists(TEXT, max_size=2),
    "metadata": fixed(user_id=TEXT), "tools": st.lists(A_TOOL.filter(
        lambda t: t.get("type") != "web_search_20250305"), max_size=2),
    "tool_choice": fixed(type=st.sampled_from(["auto", "any", "none"]),
                         disable_parallel_tool_use=st.booleans()),
    "stream": st.booleans(), "service_tier": st.sampled_from(["auto", "standard_only"]),
    "thinking": st.just({"type": "disabled"}), "cache_control": st.just({"type": "ephemeral"})})
A_BODY_OK = st.tuples(st.lists(A_MESSAGE_OK, min_size=1, max_size=4), st.integers(0, 9),
                      A_EXTRA_OK).map(
    lambda t: {"model": "m", "max_tokens": t[1], "messages": t[0], **t[2]})

# --- OpenAI bodies ---------------------------------------------------------------------------

O_TEXT = fixed(type=st.just("text"), text=TEXT)
O_PART = st.one_of(
    O_TEXT,
    fixed(type=st.just("image_url"), image_url=fixed(url=st.one_of(
        WORD.map(lambda w: "https://x/" + w), WORD.map(lambda w: "data:image/png;base64," + w)),
        detail=st.sampled_from(["auto", "low", "high"]))),
    fixed(type=st.just("input_audio"), input_audio=fixed(data=WORD, format=st.just("wav"))),
    fixed(type=st.just("file"), file=st.one_of(
        fixed(file_data=WORD.map(lambda w: "data:application/pdf;base64," + w), filename=TEXT),
        fixed(file_id=WORD))),
    fixed(type=st.just("refusal"), refusal=TEXT), JUNK)
O_CALL = fixed(id=WORD, type=st.just("function"), function=fixed(
    name=WORD, arguments=st.one_of(TOOL_INPUT.map(lambda d: exactjson.dumps(d).decode()), TEXT)))
O_MESSAGE = st.one_of(
    fixed(role=st.sampled_from(["system", "developer", "user"]),
          content=st.one_of(TEXT, st.lists(O_PART, max_size=3))).flatmap(
        lambda m: maybe(m, "name", WORD)),
    fixed(role=st.just("assistant"), content=st.one_of(st.none(), TEXT,
                                                        st.lists(O_PART, max_size=2))).flatmap(
        lambda m: maybe(m, "tool_calls", st.lists(O_CALL, max_size=2))).flatmap(
        lambda m: maybe(m, "refusal", TEXT)).flatmap(
        lambda m: maybe(m, "function_call", fixed(name=WORD, arguments=st.just("{}")))),
    fixed(role=st.just("tool"), tool_call_id=WORD, content=st.one_of(
        TEXT, st.lists(O_TEXT, max_size=2))),
    fixed(role=st.just("function"), name=WORD, content=TEXT),
    fixed(role=st.just("critic"), content=TEXT), JUNK)
O_TOOL = fixed(type=st.sampled_from(["function", "custom"]),
               function=fixed(name=WORD, description=TEXT, parameters=st.just(
                   {"type": "object", "properties": {}})))
O_EXTRA = st.fixed_dictionaries({}, optional={
    "max_tokens": st.one_of(NUMBER, JUNK), "max_completion_tokens": NUMBER,
    "temperature": st.one_of(NUMBER, JUNK), "top_p": NUMBER, "stop": st.one_of(
        TEXT, st.lists(TEXT, max_size=2), JUNK),
    "stream": st.one_of(st.booleans(), JUNK),
    "stream_options": st.one_of(fixed(include_usage=st.booleans()), JUNK),
    "tools": st.one_of(st.lists(O_TOOL, max_size=2), JUNK),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "x"]), JUNK),
    "parallel_tool_calls": st.one_of(st.booleans(), JUNK), "user": TEXT,
    "n": st.one_of(st.integers(0, 3), JUNK), "seed": JUNK, "logprobs": JUNK,
    "response_format": st.one_of(fixed(type=st.sampled_from(["text", "json_object"])), JUNK),
    "frequency_penalty": JUNK, "prompt_cache_key": TEXT, "audio": JUNK, "surprise": JUNK,
    "service_tier": st.one_of(st.sampled_from(["auto", "default", "flex"]), JUNK)})
O_BODY = st.tuples(st.lists(O_MESSAGE, min_size=1, max_size=5), O_EXTRA).map(
    lambda t: {"model": "claude-x", "messages": t[0], **t[1]})
O_PART_OK = st.one_of(O_TEXT, fixed(type=st.just("image_url"), image_url=fixed(
    url=WORD.map(lambda w: "data:image/png;base64," + w))), fixed(type=st.just("file"), file=fixed(
        file_data=WORD.map(lambda w: "data:application/pdf;base64," + w), filename=TEXT)))
O_MESSAGE_OK = st.one_of(
    fixed(role=st.sampled_from(["system", "developer"]),
          content=st.one_of(TEXT, st.lists(O_TEXT, max_size=2))),
    fixed(role=st.just("user"), content=st.one_of(TEXT, st.lists(O_PART_OK, max_size=3))),
    fixed(role=st.just("assistant"), content=st.one_of(st.none(), TEXT)).flatmap(
        lambda m: maybe(m, "tool_calls", st.lists(O_CALL, max_size=2))).flatmap(
        lambda m: maybe(m, "refusal", TEXT)),
    fixed(role=st.just("tool"), tool_call_id=WORD, content=st.one_of(
        TEXT, st.lists(O_TEXT, max_size=2))))
O_EXTRA_OK = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(0, 9), "temperature": NUMBER, "top_p": NUMBER,
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=2)), "stream": st.booleans(),
    "stream_options": fixed(include_usage=st.booleans()),
    "tools": st.lists(O_TOOL.filter(lambda t: t["type"] == "function"), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "parallel_tool_calls": st.booleans(), "user": TEXT, "n": st.just(1), "seed": st.none(),
    "response_format": st.just({"type": "text"}), "prompt_cache_key": TEXT,
    "service_tier": st.sampled_from(["auto", "default"])})
O_BODY_OK = st.tuples(st.lists(O_MESSAGE_OK, min_size=1, max_size=5), O_EXTRA_OK).map(
    lambda t: {"model": "claude-x", "messages": t[0], **t[1]})

# --- the invariant ---------------------------------------------------------------------------

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _resolves(body: Any, param: str) -> bool:
    """Whether all but the last step of ``param`` (``messages[2].content[0].type``) exist."""
    steps = [int(i) if i else k for k, i in _STEP.findall(param)]
    node = body
    for step in steps[:-1]:
        if isinstance(step, int) and isinstance(node, list) and step < len(node):
            node = node[step]
        elif isinstance(step, str) and isinstance(node, dict) and step in node:
            node = node[step]
        else:
            return False
    return True


FREE_FORM = {"input", "input_schema", "parameters", "arguments"}  # the client's own keys


def _leaves(v: Any, key: str = "", free: bool = False) -> list[tuple[str, Any]]:
    """(key, leaf) pairs: strings, numbers, and the keys of free-form objects (tool inputs and
    schemas); a string that is a JSON object (tool arguments) is opened too."""
    if isinstance(v, dict):
        return [p for k, x in v.items()
                for p in [*([("key", k)] if free else []), *_leaves(x, k, free or k in FREE_FORM)]]
    if isinstance(v, list):
        return [p for x in v for p in _leaves(x, key, free)]
    if isinstance(v, str) and v.startswith("{"):
        try:
            inner = exactjson.loads(v)
        except ValueError:
            inner = None
        if isinstance(inner, dict):
            return [(key, v), *_leaves(inner, key, True)]
    return [(key, v)]


def _accounted(body: dict[str, Any], out: dict[str, Any]) -> None:
    strings = [x for _, x in _leaves(out) if isinstance(x, str)]
    numbers = {exactjson.dumps(x) for _, x in _leaves(out)
               if isinstance(x, (int, float)) and not isinstance(x, bool)}
    blob = "\x00".join(strings)
    for key, x in _leaves(body):
        if key in CONSUMED or isinstance(x, bool) or x is None:
            continue
        if isinstance(x, str):
            if x.startswith("{") and _leaves(x) != [(key, x)]:
                continue  # tool arguments: their leaves are checked one by one
            needle = x.split(";base64,", 1)[-1] if x.startswith("data:") else x
            if key == "key" and needle in blob:
                continue
            assert needle in blob or orjson.dumps(needle).decode() in blob, (key, x)
        elif key != "key":
            text = exactjson.dumps(x)
            assert text in numbers or text.decode() in blob, (key, x)


def _check(api: Any, body: dict[str, Any]) -> None:
    try:
        out = bridging.request(api, body)
    except InvalidRequest as e:
        assert e.status == 400 and e.param, e.message  # a 400 that names the field
        assert _resolves(body, e.param), (e.param, body)
        return
    exactjson.dumps(out)  # serialisable, numbers exact
    _accounted(body, out)
    watcher = AnthropicStreamWatcher() if api == "openai" else OpenAIStreamWatcher()
    bridging.mapper(api, "m", watcher, body)  # the stream side needs nothing unchecked


SETTINGS = settings(max_examples=400, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(st.one_of(A_BODY, A_BODY_OK))
def test_a2o_translation_is_lossless_or_a_400_naming_the_field(body: dict[str, Any]) -> None:
    _check("anthropic", body)


@SETTINGS
@given(st.one_of(O_BODY, O_BODY_OK))
def test_o2a_translation_is_lossless_or_a_400_naming_the_field(body: dict[str, Any]) -> None:
    _check("openai", body)


ALL_PASSES = RewriteSettings(prune_tools=True, prune_history=True, prune_rag=True,
                             openai_prompt_cache_key=True, prune_tools_min_catalog=1,
                             history_high_watermark_tokens=20, history_low_watermark_tokens=10,
                             rag_budget_tokens=5)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(A_BODY_OK.map(lambda b: ("anthropic", "openai", b)),
                 O_BODY_OK.map(lambda b: ("openai", "anthropic", b))))
def test_a_body_the_bridge_accepts_is_still_accepted_after_every_pass(
        case: tuple[Any, str, dict[str, Any]]) -> None:
    api, provider, body = case
    try:
        bridging.request(api, body)
    except InvalidRequest:
        return
    ctx = Context(settings=ALL_PASSES, model=body["model"], provider=provider)
    _check(api, rewrite_request(body, api, ctx).body)
