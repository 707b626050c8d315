"""Constrained tool calls, point by point (issue 21): which answers each grammar takes, the
bounds that keep generation finite, and the logits processor's step rules.

Grammars are checked by feeding whole answers to llguidance over a byte-level vocabulary (one
token per byte, plus EOS: no model, no tokenizer files): an answer either parses to the end
(accepting) or is refused. The processor's rules
(only new tokens fed, tokens past the vocabulary masked, a lost sync or an empty mask passing
the logits unchanged) run against a fake matcher whose allowed set the test chooses.
Rules: :mod:`prefixgate.local_engine.server.constrained` docstring.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
import torch

from prefixgate.local_engine.server import constrained
from prefixgate.local_engine.server.constrained import (
    DEFAULT_MAX_STRING,
    GrammarProcessor,
    call_schema,
    llg_tokenizer,
    tool_call_grammar,
    tool_call_processor,
)
from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.tool_mask import ToolConstraint

llguidance = pytest.importorskip("llguidance")
pytest.importorskip("llguidance.hf")  # imports transformers: once, at collection

OBJ: dict[str, Any] = {"type": "object", "properties": {}}


class ByteVocab:
    """A vocabulary of the 256 bytes and EOS (id 256), in llguidance's TokenizerWrapper shape."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<|im_end|>"]
    special_token_ids = [256]

    def __call__(self, s: bytes | str) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode())


@lru_cache(maxsize=1)
def _llg() -> Any:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocab()))


@pytest.fixture
def hf(monkeypatch: pytest.MonkeyPatch) -> object:
    """A stand-in for the HF tokenizer whose llguidance view is the byte vocabulary."""
    token = object()
    monkeypatch.setattr(llguidance.hf, "from_tokenizer", lambda t: _llg() if t is token else None)
    monkeypatch.setattr(constrained, "_TOKENIZERS", {})
    return token


def tool(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params or OBJ}}


def accepts(lark: str, text: str) -> bool:
    """Whether ``text`` is a whole answer of grammar ``lark`` (parsed to the end, accepting)."""
    m = llguidance.LLMatcher(_llg(), constrained._compiled(lark), log_level=0)
    return bool(m.consume_tokens(list(text.encode())) and m.is_accepting())


def call(name: str, args: str = "{}") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


# ---- schema bounds (call_schema) ------------------------------------------------------------

def test_call_schema_wraps_the_parameters_in_a_closed_name_and_arguments_object() -> None:
    s = call_schema("get_weather", OBJ)
    assert s == {"type": "object",
                 "properties": {"name": {"const": "get_weather"},
                                "arguments": {"type": "object", "properties": {},
                                              "additionalProperties": False}},
                 "required": ["name", "arguments"], "additionalProperties": False,
                 "x-guidance": {"whitespace_flexible": False, "item_separator": ", ",
                                "key_separator": ": ", "lenient": True}}


def test_every_nested_object_is_closed_and_every_free_string_bounded() -> None:
    leaf = {"type": "string"}
    params = {
        "type": "object",
        "properties": {
            "o": {"properties": {"s": leaf}},                          # object by its properties
            "n": {"type": ["string", "null"]},                         # a type list
            "a": {"type": "array", "items": {"type": "object", "properties": {"s": leaf}}},
            "any": {"anyOf": [leaf, {"type": "object"}]},
            "one": {"oneOf": [leaf]}, "all": {"allOf": [leaf]},
            "tup": {"type": "array", "prefixItems": [leaf]},
            "pp": {"type": "object", "patternProperties": {"^x": leaf}},
            "ap": {"type": "object", "additionalProperties": {"type": "object", "properties": {"s": leaf}}},
            "not": {"not": {"type": "object", "properties": {"s": leaf}}},
        },
        "definitions": {"D": {"type": "object", "properties": {"s": leaf}}},
    }
    args = call_schema("f", params, max_string=7)["properties"]["arguments"]
    p = args["properties"]
    assert args["additionalProperties"] is False
    assert p["o"]["additionalProperties"] is False and p["o"]["properties"]["s"]["maxLength"] == 7
    assert p["n"]["maxLength"] == 7
    assert p["a"]["items"]["additionalProperties"] is False
    assert p["a"]["items"]["properties"]["s"]["maxLength"] == 7
    assert p["any"]["anyOf"][0]["maxLength"] == 7 and p["any"]["anyOf"][1]["additionalProperties"] is False
    assert p["one"]["oneOf"][0]["maxLength"] == 7 and p["all"]["allOf"][0]["maxLength"] == 7
    assert p["tup"]["prefixItems"][0]["maxLength"] == 7
    assert p["pp"]["patternProperties"]["^x"]["maxLength"] == 7
    assert p["ap"]["additionalProperties"]["additionalProperties"] is False
    assert p["ap"]["additionalProperties"]["properties"]["s"]["maxLength"] == 7
    assert p["not"]["not"]["additionalProperties"] is False
    assert p["not"]["not"]["properties"]["s"]["maxLength"] == 7
    root = call_schema("f", params, max_string=7)
    assert root["definitions"]["D"]["properties"]["s"]["maxLength"] == 7
    assert root["definitions"]["D"]["additionalProperties"] is False


@pytest.mark.parametrize("leaf", [
    {"type": "string", "maxLength": 3}, {"type": "string", "enum": ["a"]},
    {"type": "string", "const": "a"}, {"type": "string", "pattern": "^a+$"},
    {"type": "string", "format": "date"}, {"type": "integer"}, {"enum": ["a"]},
])
def test_a_string_the_client_already_bounds_is_left_as_written(leaf: dict[str, Any]) -> None:
    params = {"type": "object", "properties": {"x": leaf}}
    assert call_schema("f", params)["properties"]["arguments"]["properties"]["x"] == leaf


def test_an_object_keeps_the_clients_additional_properties() -> None:
    params = {"type": "object", "properties": {}, "additionalProperties": True,
              "items": True, "not": False}
    args = call_schema("f", params)["properties"]["arguments"]
    assert args["additionalProperties"] is True and args["items"] is True and args["not"] is False


def test_default_string_bound_and_the_clients_schema_untouched() -> None:
    params = {"type": "object", "properties": {"s": {"type": "string"}},
              "$defs": {"P": {"type": "string"}}}
    s = call_schema("f", params)
    assert s["properties"]["arguments"]["properties"]["s"]["maxLength"] == DEFAULT_MAX_STRING == 1024
    assert "$defs" not in s["properties"]["arguments"] and s["$defs"]["P"]["maxLength"] == 1024
    assert params == {"type": "object", "properties": {"s": {"type": "string"}},
                      "$defs": {"P": {"type": "string"}}}


# ---- which answers each grammar takes -------------------------------------------------------

STR_TOOL = tool("put", {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})


def test_required_takes_exactly_one_call_of_an_allowed_tool() -> None:
    tools = [STR_TOOL, tool("get"), tool("drop")]
    g = tool_call_grammar(tools, ToolConstraint("required", ("put", "get")), max_string=3)
    assert accepts(g, call("get"))
    assert accepts(g, call("put", '{"s": "abc"}'))
    assert not accepts(g, call("drop"))                     # not allowed
    assert not accepts(g, "Sure. " + call("get"))           # text before the call
    assert not accepts(g, call("get") + "\n" + call("get"))  # a second call
    assert not accepts(g, call("get") + " done")            # text after the closing tag
    assert not accepts(g, "")                               # no call at all


def test_required_string_arguments_stop_at_the_bound() -> None:
    g = tool_call_grammar([STR_TOOL], ToolConstraint("required", ("put",)), max_string=3)
    assert accepts(g, call("put", '{"s": "abc"}'))
    assert not accepts(g, call("put", '{"s": "abcd"}'))
    assert not accepts(g, call("put", '{"s": "a", "t": 1}'))  # closed object
    assert not accepts(g, call("put", "{}"))                  # required kept
    assert not accepts(g, '<tool_call>\n{"name":"put","arguments":{"s":"a"}}\n</tool_call>')


def test_auto_takes_text_or_text_then_one_allowed_call() -> None:
    tools = [tool("get"), tool("drop")]
    g = tool_call_grammar(tools, ToolConstraint("auto", ("get",)))
    assert accepts(g, "It is sunny.")
    assert accepts(g, "Checking. " + call("get"))
    assert accepts(g, call("get"))
    assert not accepts(g, "")
    assert not accepts(g, "Checking. " + call("drop"))
    assert not accepts(g, "x " + call("get") + call("get"))
    assert not accepts(g, "I could write <tool_call> here")


def test_none_takes_only_text_without_a_call_tag() -> None:
    g = tool_call_grammar([tool("get")], ToolConstraint("none", ()))
    assert accepts(g, "") and accepts(g, "plain text\nover lines")
    assert not accepts(g, call("get"))
    assert not accepts(g, "text <tool_call> more")


def test_a_non_ascii_const_is_kept_as_written() -> None:
    params = {"type": "object", "properties": {"city": {"enum": ["Zürich"]}}, "required": ["city"]}
    g = tool_call_grammar([tool("get", params)], ToolConstraint("required", ("get",)))
    assert accepts(g, call("get", '{"city": "Zürich"}'))
    assert not accepts(g, call("get", '{"city": "Zurich"}'))


# ---- the processor --------------------------------------------------------------------------

class FakeMatcher:
    """Allows the token ids in ``allowed`` (a bitmask over ``bits`` ids); records what it is fed."""

    def __init__(self, allowed: set[int], bits: int = 32, ok: bool = True) -> None:
        self.allowed, self.bits, self.ok = allowed, bits, ok
        self.fed: list[list[int]] = []

    def consume_tokens(self, tokens: list[int]) -> bool:
        self.fed.append(list(tokens))
        return self.ok

    def compute_bitmask(self) -> bytes:
        flags = np.array([i in self.allowed for i in range(self.bits)], dtype=np.uint8)
        return np.packbits(flags, bitorder="little").tobytes()

    def get_error(self) -> str:
        return "token 9 not allowed"


def test_processor_masks_to_minus_inf_and_feeds_only_new_tokens() -> None:
    m = FakeMatcher({1, 3})
    proc = GrammarProcessor(m, vocab_size=10)
    assert proc.failed is False
    logits = torch.arange(10, dtype=torch.float16)
    out = proc([], logits)
    assert out.dtype == torch.float16
    assert out[1] == 1 and out[3] == 3
    assert torch.isneginf(out[[0, 2, 4, 5, 6, 7, 8, 9]]).all()
    assert m.fed == []  # nothing sampled yet: nothing fed
    proc([5], logits)
    proc([5, 6, 7], logits)
    proc([5, 6, 7], logits)  # no new token: not fed again
    assert m.fed == [[5], [6, 7]] and proc.failed is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an accelerator")
def test_the_mask_follows_the_logits_device() -> None:
    logits = torch.zeros(10, device="cuda")
    out = GrammarProcessor(FakeMatcher({2}), vocab_size=10)([], logits)
    assert out.device == logits.device and torch.isfinite(out).nonzero().flatten().tolist() == [2]


def test_tokens_past_the_vocabulary_are_masked() -> None:
    """A model's embedding is often padded past the tokenizer's vocabulary: those ids must never
    be sampled, even where the matcher's last bitmask word has their bits set."""
    proc = GrammarProcessor(FakeMatcher(set(range(32))), vocab_size=10)
    out = proc([], torch.zeros(16))
    assert torch.isfinite(out[:10]).all() and torch.isneginf(out[10:]).all()
    narrow = GrammarProcessor(FakeMatcher(set(range(32))), vocab_size=10)(  # logits narrower than vocab
        [], torch.zeros(6))
    assert torch.isfinite(narrow).all() and narrow.shape == (6,)


def test_a_lost_sync_passes_the_logits_unchanged_from_then_on(caplog: pytest.LogCaptureFixture) -> None:
    m = FakeMatcher({1}, ok=False)
    proc = GrammarProcessor(m, vocab_size=10)
    logits = torch.arange(10, dtype=torch.float32)
    with caplog.at_level(logging.WARNING, logger="local_engine.constrained"):
        assert torch.equal(proc([9], logits), logits)
    assert proc.failed
    assert [r.getMessage() for r in caplog.records] == ["constrained decoding lost sync: token 9 not allowed"]
    m.ok = True
    assert torch.equal(proc([9, 1], logits), logits)  # stays off
    assert m.fed == [[9]]


def test_an_empty_mask_passes_the_logits_unchanged() -> None:
    proc = GrammarProcessor(FakeMatcher(set()), vocab_size=10)
    logits = torch.arange(10, dtype=torch.float32)
    assert torch.equal(proc([], logits), logits) and proc.failed


def test_tool_call_processor_forces_the_call_then_eos(hf: object) -> None:
    proc = tool_call_processor(hf, [STR_TOOL], ToolConstraint("required", ("put",)), max_string=2)
    assert proc.vocab_size == 257 and not proc.failed
    text = call("put", '{"s": "ab"}').encode()
    for n in range(len(text) + 1):
        out = proc(list(text[:n]), torch.zeros(260))
        allowed = torch.isfinite(out).nonzero().flatten().tolist()
        if n < len(text):
            if text[n:n + 1] == b'"' and text[:n].endswith(b'"ab'):
                assert allowed == [ord('"')]  # max_string reached: the string must close
            assert text[n] in allowed and 256 not in allowed
        else:
            assert allowed == [256]  # after the closing tag only EOS
    assert not proc.failed


def test_a_schema_llguidance_cannot_enforce_is_a_400_naming_tools(hf: object) -> None:
    bad = tool("get", {"type": "object", "properties": {"x": {"type": "strin"}}})
    with pytest.raises(ApiError) as err:
        tool_call_processor(hf, [bad], ToolConstraint("required", ("get",)))
    e = err.value
    assert (e.status, e.param, e.code) == (400, "tools", "invalid_value")
    assert e.message.startswith("A tool's parameters schema cannot be enforced: ") and "strin" in e.message


def test_a_grammar_llguidance_cannot_compile_is_a_400_naming_tools(hf: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constrained, "tool_call_grammar", lambda *a: "start: (")
    with pytest.raises(ApiError) as err:
        tool_call_processor(hf, [tool("get")], ToolConstraint("required", ("get",)))
    e = err.value
    assert (e.status, e.param, e.code) == (400, "tools", "invalid_value")
    assert e.message.startswith("A tool's parameters schema cannot be enforced: ")


def test_a_forced_schema_nested_too_deep_is_a_400_before_compiling(hf: object) -> None:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(70):
        s = {"type": "array", "items": s}
    deep = tool("deep", {"type": "object", "properties": {"x": s}})
    with pytest.raises(ApiError) as err:
        tool_call_processor(hf, [deep], ToolConstraint("required", ("deep",)))
    assert err.value.status == 400 and err.value.param.startswith("tools[0]")


def test_a_forced_schema_whose_refs_nest_too_deep_is_a_400(hf: object) -> None:
    """Each definition is shallow (the tool's JSON passes the definition check), but followed
    through its ``$ref``s the forced schema nests past the limit: refused before compiling."""
    n = 70
    defs: dict[str, Any] = {f"d{i}": {"type": "object", "properties": {"y": {"$ref": f"#/$defs/d{i + 1}"}},
                                      "required": ["y"]} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    params = {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}
    tools = [tool("chain", params)]
    with pytest.raises(ApiError) as err:
        tool_call_processor(hf, tools, ToolConstraint("required", ("chain",)))
    assert err.value.status == 400 and err.value.param == "tools[0].function.parameters"
    tool_call_processor(hf, tools, ToolConstraint("none", ()))  # not forced: not expanded


def test_llg_tokenizer_is_built_once_per_tokenizer_object(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []

    def fake(hf: Any) -> tuple[str, int]:
        built.append(hf)
        return ("llg", len(built))

    monkeypatch.setattr(llguidance.hf, "from_tokenizer", fake)
    monkeypatch.setattr(constrained, "_TOKENIZERS", {})
    a, b = object(), object()
    assert llg_tokenizer(a) == ("llg", 1) and llg_tokenizer(a) == ("llg", 1)
    assert llg_tokenizer(b) == ("llg", 2)
    # an entry left by a dead tokenizer whose id was reused is not served to the new one
    constrained._TOKENIZERS[id(a)] = (b, ("stale", 0))
    assert llg_tokenizer(a) == ("llg", 3) and built == [a, b, a]
