"""Constrained decoding of tool calls: a grammar over the tool-call format, a token mask per step.

A :class:`ToolConstraint` (:mod:`prefixgate.local_engine.server.tool_mask`) becomes a Lark grammar compiled by
llguidance (guidance-ai/llguidance: Earley parser + derivative-based lexer in Rust; it computes
the set of vocabulary tokens that can continue a valid prefix, ~0.1-1 ms per step on CPU for
the 49k-token SmolLM2 vocabulary). The answer's shapes (Hermes format, as ``chat.py`` prompts it
and ``tool_calls.py`` parses it)::

    required:  <tool_call>\\n{"name": "<allowed>", "arguments": {...}}\\n</tool_call>
    auto:      free text without "<tool_call>", or text then one such call of an allowed tool
    none:      free text without "<tool_call>" (or nothing)

``arguments`` must validate against that tool's ``parameters`` JSON schema (types, required,
enum/const, nested objects and arrays, numbers, booleans, ``$defs`` refs; llguidance's JSON
schema support, lenient: an unsupported keyword is ignored rather than refused). Two choices
keep generation finite and parseable: an object schema with no ``additionalProperties`` gets
``false`` (only declared keys; still valid against the client's schema), and a string with no
``maxLength`` gets :data:`DEFAULT_MAX_STRING` characters. The JSON is written with
``json.dumps``'s separators (``", "``, ``": "``), as the prompt shows past calls. After the
closing tag only EOS is allowed. A call cut by ``max_tokens`` stays unparsed text (finish
reason ``length``), as without the mask.

:func:`tool_call_processor` returns a per-sequence logits processor, the engine's seam
(``SamplingParams.logits_processors``): ``(completion_ids, logits [V]) -> logits [V]``.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.schema_depth import check_tool_depths
from prefixgate.local_engine.server.tool_mask import ToolConstraint, tool_name, tool_parameters

__all__ = ["DEFAULT_MAX_STRING", "GrammarProcessor", "call_schema", "llg_tokenizer",
           "tool_call_grammar", "tool_call_processor"]

log = logging.getLogger("local_engine.constrained")

DEFAULT_MAX_STRING = 1024
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
               "lenient": True}
_TEXT = r'TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/'
_OPEN = r'OPEN: /(.|\n)*<tool_call>\n/ & ~/(.|\n)*<tool_call>(.|\n)*<tool_call>(.|\n)*/'
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _bounded(schema: Any, max_string: int) -> Any:
    """``schema`` with closed objects and bounded strings (module docstring), recursively."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    kinds = out.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if ("object" in kinds or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if "string" in kinds and "maxLength" not in out and "enum" not in out and "const" not in out \
            and "pattern" not in out and "format" not in out:
        out["maxLength"] = max_string
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _bounded(v, max_string) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_bounded(v, max_string) for v in out[key]]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _bounded(out[key], max_string)
    return out


def call_schema(name: str, parameters: dict[str, Any],
                max_string: int = DEFAULT_MAX_STRING) -> dict[str, Any]:
    """JSON schema of one call ``{"name": name, "arguments": <parameters>}``; the parameters'
    ``$defs`` / ``definitions`` move to the root so ``#/$defs/..`` refs still resolve."""
    params = _bounded(copy.deepcopy(parameters), max_string)
    root: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        "x-guidance": JSON_FORMAT,
    }
    for key in ("$defs", "definitions"):
        if isinstance(params.get(key), dict):
            root[key] = params.pop(key)
    return root


def tool_call_grammar(tools: list[dict[str, Any]], constraint: ToolConstraint,
                      max_string: int = DEFAULT_MAX_STRING) -> str:
    """The Lark grammar (llguidance dialect) of the answers ``constraint`` allows."""
    if constraint.mode == "none":
        return f'start: "" | TEXT\n{_TEXT}\n'
    by_name = {tool_name(t): t for t in tools}
    rules = []
    for i, name in enumerate(constraint.names):
        schema = call_schema(name, tool_parameters(by_name[name]), max_string)
        rules.append(f"call_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines = ["call: " + " | ".join(f"call_{i}" for i in range(len(rules))), *rules]
    if constraint.mode == "required":
        head = r'start: "<tool_call>\n" call "\n</tool_call>"'
    else:
        head = r'start: TEXT | OPEN call "\n</tool_call>"' + f"\n{_TEXT}\n{_OPEN}"
    return head + "\n" + "\n".join(lines) + "\n"


_TOKENIZERS: dict[int, tuple[Any, Any]] = {}
_TOKENIZERS_LOCK = threading.Lock()


def llg_tokenizer(hf_tokenizer: Any) -> Any:
    """llguidance's view of an HF tokenizer (every token's bytes), built once per tokenizer
    object (~1 s for a 49k vocabulary) and kept for the process's life."""
    import llguidance.hf

    with _TOKENIZERS_LOCK:
        hit = _TOKENIZERS.get(id(hf_tokenizer))
        if hit is None or hit[0] is not hf_tokenizer:
            hit = (hf_tokenizer, llguidance.hf.from_tokenizer(hf_tokenizer))
            _TOKENIZERS[id(hf_tokenizer)] = hit
        return hit[1]


@lru_cache(maxsize=256)
def _compiled(lark: str) -> str:
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_lark(lark))


class GrammarProcessor:
    """A per-sequence logits processor enforcing one grammar.

    ``__call__(completion_ids, logits)``: feeds the tokens sampled since the last call to the
    matcher, then returns ``logits`` ([V], any float dtype) with every token the grammar cannot
    take next set to -inf. Tokens past the tokenizer's vocabulary (padded embeddings) are
    masked too. Should the matcher ever fail (a token it did not allow was forced in), the
    logits pass unchanged and the failure is logged: the answer is then parsed as usual.
    """

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._seen = 0
        self.failed = False

    def _mask(self, width: int, device: torch.device) -> torch.Tensor:
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[: min(width, self.vocab_size)]
        allowed = torch.zeros(width, dtype=torch.bool)
        allowed[: bits.shape[0]] = torch.from_numpy(bits.astype(np.bool_))
        return allowed.to(device)

    def __call__(self, completion_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.failed:
            return logits
        new = completion_ids[self._seen:]
        self._seen = len(completion_ids)
        if new and not self.matcher.consume_tokens(new):
            self.failed = True
            log.warning("constrained decoding lost sync: %s", self.matcher.get_error())
            return logits
        allowed = self._mask(logits.shape[-1], logits.device)
        if not bool(allowed.any()):
            self.failed = True
            return logits
        return logits.masked_fill(~allowed, float("-inf"))


def tool_call_processor(hf_tokenizer: Any, tools: list[dict[str, Any]],
                        constraint: ToolConstraint,
                        max_string: int = DEFAULT_MAX_STRING) -> GrammarProcessor:
    """A fresh :class:`GrammarProcessor` for one request's tool constraint. Raises
    ApiError(400) when a forced tool's schema nests too deep (``schema_depth``: checked before
    anything here recurses into it) or cannot be compiled (param ``tools``): llguidance's
    ``grammar_from_lark`` never raises (it only wraps the text), and its ``LLMatcher`` never
    raises for a grammar error either but enters an error state, read here."""
    import llguidance

    check_tool_depths(tools, constraint.names)
    tok = llg_tokenizer(hf_tokenizer)
    grammar = _compiled(tool_call_grammar(tools, constraint, max_string))
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    if matcher.is_error():
        raise ApiError(f"A tool's parameters schema cannot be enforced: {matcher.get_error()}",
                       param="tools", code="invalid_value")
    return GrammarProcessor(matcher, tok.vocab_size)
