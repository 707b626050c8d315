"""Deeply nested tool JSON is a 400 naming the tool and the limit, never a 500 nor a crash
(issue 20, Low: a forced tool call whose schema nested ``anyOf`` 200 deep was a 500
``RecursionError``).

Cases: nesting by ``anyOf``, ``oneOf``, ``items``, ``properties`` and ``not``, forced or not,
over HTTP; and ones the issue does not name — a forced schema whose ``$ref`` chain of nested
definitions overflowed llguidance's native stack (SIGSEGV: the engine process and every stream
with it; run in a child process here), recursive schemas that must still compile, tool-call
``arguments`` in the history nested past ``json.loads``'s limit, and a model answer that writes
thousands of brackets inside ``<tool_call>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.schema_depth import (
    MAX_TOOL_DEPTH,
    check_tool_depths,
    expanded_depth,
    json_depth,
)
from prefixgate.local_engine.server.tool_calls import parse_tool_calls
from tests.engine_server import conftest as engine_fixtures

tiny_dir, engine, base_url = (engine_fixtures.tiny_dir, engine_fixtures.engine,
                              engine_fixtures.base_url)
REPO = Path(__file__).resolve().parents[2]


def nested(kind: str, depth: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        s = {"anyOf": {"anyOf": [s, {"type": "null"}]}, "oneOf": {"oneOf": [s]},
             "items": {"type": "array", "items": s}, "not": {"not": s},
             "properties": {"type": "object", "properties": {"x": s}}}[kind]
    return s


def tool(params: dict[str, Any], name: str = "deep_tool") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def ref_chain(n: int) -> dict[str, Any]:
    """``n`` definitions, each an object whose one property refers to the next."""
    defs: dict[str, Any] = {f"d{i}": {"type": "object", "properties": {"y": {"$ref": f"#/$defs/d{i + 1}"}},
                                      "required": ["y"]} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


@pytest.mark.parametrize("kind", ["anyOf", "oneOf", "items", "properties", "not"])
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "free"])
def test_deep_tool_schemas_are_a_400_naming_the_tool_and_the_limit(base_url: str, kind: str,
                                                                   forced: bool) -> None:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 3,
                            "messages": [{"role": "user", "content": "hi"}],
                            "tools": [tool({"type": "object", "properties": {"a": {"type": "string"}}},
                                           "fine"), tool({"type": "object",
                                                          "properties": {"a": nested(kind, 200)}})]}
    if forced:
        body["tool_choice"] = {"type": "function", "function": {"name": "deep_tool"}}
    for path in ("/v1/chat/completions", "/tokenize", "/v1/cache/match"):
        r = httpx.post(base_url + path, content=json.dumps(body),
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, (path, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == "tools[1]" and "'deep_tool'" in err["message"]
        assert str(MAX_TOOL_DEPTH) in err["message"]


def test_the_limit_is_exact() -> None:
    levels = MAX_TOOL_DEPTH - 5  # tool, function, parameters, properties, then items levels + 1
    at = tool({"type": "object", "properties": {"a": nested("items", levels)}})
    assert json_depth(at) == MAX_TOOL_DEPTH
    check_tool_depths([at], forced=("deep_tool",))
    over = tool({"type": "object", "properties": {"a": nested("items", levels + 1)}})
    with pytest.raises(ApiError):
        check_tool_depths([over])


def test_ref_chains_count_their_hops_and_recursion_adds_nothing() -> None:
    assert expanded_depth(ref_chain(40)) > MAX_TOOL_DEPTH >= json_depth(ref_chain(40))
    tree = {"type": "object", "properties": {"root": {"$ref": "#/$defs/n"}}, "$defs": {"n": {
        "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}}
    cycle = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    assert expanded_depth(tree) < 12 and expanded_depth(cycle) < 8
    check_tool_depths([tool(ref_chain(40))])  # free: no grammar follows the refs
    with pytest.raises(ApiError) as ei:
        check_tool_depths([tool(ref_chain(40))], forced=("deep_tool",))
    assert ei.value.param == "tools[0].function.parameters"


CHILD = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    from prefixgate.local_engine.server.constrained import tool_call_processor
    from prefixgate.local_engine.server.protocol import ApiError
    from prefixgate.local_engine.server.tool_mask import ToolConstraint
    sys.path.insert(0, ".")
    from tests.adversarial.test_engine_deep_tool_schemas import ref_chain, tool
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    n = int(sys.argv[2])
    recursive = {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}, "$defs": {"n": {
        "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}}
    tool_call_processor(tok, [tool(recursive)], ToolConstraint("required", ("deep_tool",)))
    try:
        tool_call_processor(tok, [tool(ref_chain(n))], ToolConstraint("required", ("deep_tool",)))
        print("compiled")
    except ApiError as exc:
        print("refused", exc.status, exc.param)
""")


@pytest.mark.slow  # a child process loading torch + the llguidance tokenizer: ~20 s here
def test_a_forced_ref_chain_is_refused_before_it_can_crash_the_process(tiny_dir: Path) -> None:
    """1500 nested definitions overflowed llguidance's stack (SIGSEGV) before the check."""
    got = subprocess.run([sys.executable, "-c", CHILD, str(tiny_dir), "1500"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split()[-3:] == ["refused", "400", "tools[0].function.parameters"]


def test_deep_tool_call_arguments_in_the_history_are_kept_as_text(base_url: str) -> None:
    deep = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError past ~1000
    body = {"model": "tiny", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "f", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "tools": [tool({"type": "object"}, "f")]}
    r = httpx.post(base_url + "/tokenize", json=body, timeout=60)
    assert r.status_code == 200, r.text[:300]


def test_a_model_writing_thousands_of_brackets_is_text_not_a_crash() -> None:
    text = "<tool_call>\n" + "[" * 5000 + "]" * 5000 + "\n</tool_call>"
    out = parse_tool_calls(text)
    assert out.tool_calls == [] and out.content is not None and "[[[" in out.content
