"""KNOWN_DEFECTS: the defect classes the fuzzer finds in the current code, allowed for now.

Each entry names the violation kinds it covers, on which paths (client API -> backend API), a
regex on the violation's detail when the kind alone is too broad, the issue-8 class, and a
minimal reproducer (client API, model, raw JSON body). The differential fuzz test
(``test_differential.py``) fails on any violation no entry covers; ``test_known_defects.py``
fails for an entry whose reproducer no longer reproduces — remove the entry in the change that
fixes it, and the fuzzer becomes strict for that class. Empty list = every invariant enforced.

Models: ``gpt-fuzz`` routes to an OpenAI-compatible backend, ``claude-fuzz`` to an Anthropic
backend (see :mod:`tests.fuzz.harness`), so ``("anthropic", "gpt-fuzz")`` is the A->O bridge and
``("openai", "claude-fuzz")`` the O->A bridge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.fuzz.meaning import Violation

O2A, A2O = "openai->anthropic", "anthropic->openai"
SAME = ("openai->openai", "anthropic->anthropic")


@dataclass(frozen=True)
class KnownDefect:
    """One allowed defect class (see module docstring). ``raw`` is the reproducer's body."""

    id: str
    issue_class: int
    summary: str
    kinds: tuple[str, ...]
    paths: tuple[str, ...]
    api: str
    model: str
    raw: str
    detail: str = ""
    body: str = ""  # regex the client's raw body must match (the defect's trigger), if any
    headers: tuple[tuple[str, bytes], ...] = ()  # request headers of the reproducer

    def covers(self, path: str, v: Violation, raw: bytes = b"") -> bool:
        """Whether this entry allows violation ``v`` seen on ``path`` for client body ``raw``."""
        return (v.kind in self.kinds and (not self.paths or path in self.paths)
                and (not self.detail or re.search(self.detail, v.detail) is not None)
                and (not self.body or re.search(self.body.encode(), raw) is not None))


def _turns(n: int, words: int) -> list[dict[str, str]]:
    """A long chat: the task first, then ``n`` long user/assistant turns (history pruning)."""
    filler = " ".join(["the refund policy covers flights booked online"] * (words // 7))
    msgs = [{"role": "user", "content": "TASK: audit invoice 7 against the contract."}]
    for i in range(n):
        msgs += [{"role": "assistant", "content": f"step {i}: {filler}"},
                 {"role": "user", "content": f"continue {i}: {filler}"}]
    return msgs


_BIG_CALL = ('{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":'
             '{"name":"get_order","arguments":"{\\"order_id\\":123456789012345678901234567890}"}}]}')
_TOOLS14 = [{"name": n, "description": f"{n.replace('_', ' ')} records", "input_schema": {"type": "object"}}
            for v in ("get", "list") for n in (f"{v}_weather", f"{v}_order", f"{v}_user", f"{v}_flight",
                                               f"{v}_invoice", f"{v}_file", f"{v}_repo")]


def _nested_markers() -> dict[str, object]:
    """Four client cache_control markers (a tool, a text nested in tool_result, two user
    texts) and a system prompt long enough for place_breakpoints to add its own."""
    cc = {"type": "ephemeral"}
    return {"model": "claude-fuzz", "max_tokens": 64,
            "system": " ".join(["the refund policy covers flights booked online by the customer"] * 200),
            "tools": [{"name": "get_order", "input_schema": {"type": "object"}, "cache_control": cc}],
            "messages": [
                {"role": "user", "content": "where is order 1?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_order",
                                                   "input": {"id": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "order 1 shipped", "cache_control": cc}]}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": cc},
                                             {"type": "text", "text": "b", "cache_control": cc}]}]}


KNOWN_DEFECTS: tuple[KnownDefect, ...] = ()


def uncovered(path: str, violations: list[Violation], raw: bytes = b"") -> list[Violation]:
    """The violations of client body ``raw`` on ``path`` that no KNOWN_DEFECTS entry covers."""
    return [v for v in violations if not any(d.covers(path, v, raw) for d in KNOWN_DEFECTS)]
