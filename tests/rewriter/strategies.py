"""Hypothesis strategies for request bodies of both APIs (valid conversations + odd extras).

Bodies are built as ordered key lists so that key order itself is random: extra keys the IR does
not model (``metadata``, ``x_extra``...) land at random positions of bodies, messages and
blocks, which is what the round-trip identity must preserve.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
NONEMPTY = st.text(alphabet="abcdefghij klmnop.,:-0123456789", min_size=1, max_size=40)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), TEXT)
JSONV = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(NONEMPTY, inner, max_size=3)), max_leaves=6)
EXTRA_KEYS = st.sampled_from(["metadata", "x_extra", "name", "annotations", "citations", "zz"])
TOOL_NAMES = st.sampled_from(["get_weather", "send_email", "search", "calc", "fs_read_tree",
                              "gh_search", "book", "cancel"])


@st.composite
def with_extras(draw: st.DrawFn, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Dict of ``pairs`` with 0-2 extra keys inserted at random positions."""
    pairs = list(pairs)
    for _ in range(draw(st.integers(0, 2))):
        k = draw(EXTRA_KEYS)
        if any(k == p[0] for p in pairs):
            continue
        pairs.insert(draw(st.integers(0, len(pairs))), (k, draw(JSONV)))
    return dict(pairs)


def _schema(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(st.dictionaries(st.sampled_from(["city", "q", "n", "to", "body"]),
                                 st.fixed_dictionaries({"type": st.sampled_from(
                                     ["string", "integer"])}), max_size=3))
    pairs = [("type", "object"), ("properties", props)]
    if props and draw(st.booleans()):
        pairs.append(("required", sorted(props)))
    return dict(draw(st.permutations(pairs)))


@st.composite
def openai_tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-5 distinct OpenAI function tools with randomly ordered schema keys."""
    names = draw(st.lists(TOOL_NAMES, min_size=1, max_size=5, unique=True))
    return [{"type": "function", "function": dict(draw(st.permutations([
        ("name", n), ("description", draw(NONEMPTY)), ("parameters", _schema(draw))])))}
        for n in names]


@st.composite
def anthropic_tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-5 distinct Anthropic tools with randomly ordered keys."""
    names = draw(st.lists(TOOL_NAMES, min_size=1, max_size=5, unique=True))
    return [dict(draw(st.permutations([("name", n), ("description", draw(NONEMPTY)),
                                       ("input_schema", _schema(draw))]))) for n in names]


@st.composite
def openai_content(draw: st.DrawFn) -> Any:
    """A string, or a list of text / image_url parts (some with cache_control)."""
    if draw(st.booleans()):
        return draw(NONEMPTY)
    parts: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 4)) == 0:
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                    + draw(NONEMPTY)}})
        else:
            p = [("type", "text"), ("text", draw(NONEMPTY))]
            if draw(st.integers(0, 5)) == 0:
                p.append(("cache_control", {"type": "ephemeral"}))
            parts.append(draw(with_extras(p)))
    return parts


@st.composite
def openai_requests(draw: st.DrawFn, clock: str | None = None) -> dict[str, Any]:
    """A valid Chat Completions body: optional system, user/assistant turns, tool rounds."""
    tools = draw(openai_tools())
    names = [t["function"]["name"] for t in tools]
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()) or clock:
        sys_text = draw(NONEMPTY) + (f"\nNow: {clock}\n" if clock else "") + draw(NONEMPTY)
        msgs.append({"role": draw(st.sampled_from(["system", "developer"])), "content": sys_text})
    call_no = 0
    for _ in range(draw(st.integers(1, 4))):
        msgs.append(draw(with_extras([("role", "user"), ("content", draw(openai_content()))])))
        if draw(st.booleans()):
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                call_no += 1
                calls.append({"id": f"call_{call_no}", "type": "function", "function": {
                    "name": draw(st.sampled_from(names)), "arguments": "{}"}})
            msgs.append(draw(with_extras([("role", "assistant"), ("content", None),
                                          ("tool_calls", calls)])))
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": draw(NONEMPTY)})
        msgs.append({"role": "assistant", "content": draw(NONEMPTY)})
    msgs.pop()  # the request ends before the answer
    pairs = [("model", "gpt-4o"), ("messages", msgs), ("tools", tools)]
    if draw(st.booleans()):
        pairs.append(("tool_choice", {"type": "function", "function": {
            "name": draw(st.sampled_from(names))}}))
    return draw(with_extras(draw(st.permutations(pairs))))


@st.composite
def anthropic_content(draw: st.DrawFn, role: str) -> Any:
    """A string, or text / image blocks (some with cache_control)."""
    if draw(st.booleans()):
        return draw(NONEMPTY)
    blocks: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        if role == "user" and draw(st.integers(0, 4)) == 0:
            blocks.append({"type": "image", "source": {"type": "base64", "media_type":
                                                       "image/png", "data": draw(NONEMPTY)}})
        else:
            p = [("type", "text"), ("text", draw(NONEMPTY))]
            if draw(st.integers(0, 6)) == 0:
                p.append(("cache_control", {"type": "ephemeral"}))
            blocks.append(draw(with_extras(p)))
    return blocks


@st.composite
def anthropic_requests(draw: st.DrawFn, clock: str | None = None) -> dict[str, Any]:
    """A valid Messages body: system string or blocks, alternating turns, tool rounds."""
    tools = draw(anthropic_tools())
    names = [t["name"] for t in tools]
    msgs: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    use_no = 0
    for _ in range(draw(st.integers(1, 4))):
        content = draw(anthropic_content("user"))
        if pending:
            content = pending + ([{"type": "text", "text": content}]
                                 if isinstance(content, str) else content)
            pending = []
        msgs.append(draw(with_extras([("role", "user"), ("content", content)])))
        if draw(st.booleans()):
            use_no += 1
            tid = f"toolu_{use_no:03d}"
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": draw(NONEMPTY)},
                {"type": "tool_use", "id": tid, "name": draw(st.sampled_from(names)),
                 "input": {}}]})
            pending = [{"type": "tool_result", "tool_use_id": tid, "content": draw(NONEMPTY)}]
        else:
            msgs.append({"role": "assistant", "content": draw(anthropic_content("assistant"))})
    if pending:
        msgs.append({"role": "user", "content": pending})
    else:
        msgs.pop()
    sys_text = draw(NONEMPTY) + (f"\nNow: {clock}\n" if clock else "")
    system: Any = sys_text
    if draw(st.booleans()):
        system = [draw(with_extras([("type", "text"), ("text", sys_text)]))]
        if draw(st.booleans()):
            system[0]["cache_control"] = {"type": "ephemeral"}
    pairs = [("model", "claude-sonnet-4-5"), ("max_tokens", 64), ("system", system),
             ("messages", msgs), ("tools", tools)]
    return draw(with_extras(draw(st.permutations(pairs))))
