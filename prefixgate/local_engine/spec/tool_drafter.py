"""``ToolSchemaDrafter``: drafts tool-call JSON from the request's tool schemas and earlier calls.

Behind the ``drafters.Drafter`` interface. Per request it decodes the prompt once, reads its
``<tools>`` block and earlier ``<tool_call>`` blocks (``tool_call_state.ToolContext``), and
each step decodes the output so far, asks ``tool_call_state.next_literal`` what the schema
makes likely next (the frame, the tool name, argument keys, enum values, values repeated from
earlier calls) and tokenizes that text as the draft. Requests whose prompt declares no tools
get no draft and cost one cached check per step. Mixed with n-gram / suffix drafting through
``drafters.ChainDrafter`` (the longest proposal wins): the schema fills the structure, the
copy drafters the values seen in the context.

Tokenization: the draft is the proposal text encoded alone; where the model would merge the
proposal's first characters with its last token, the draft is rejected by verification (a
draft never changes the output, only the cost of a step).
"""

from __future__ import annotations

from typing import Any

from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.sched.tool_call_state import ToolContext, next_literal, tool_context_or_none
from prefixgate.local_engine.spec.drafters import Draft

PROMPT_TAIL_CHARS = 2000  # prompt text kept for the tail: an open call started by the prompt
OUTPUT_TAIL_TOKENS = 256  # output tokens decoded each step (a call's JSON fits)


class _ReqTools:
    __slots__ = ("ctx", "prompt_tail")

    def __init__(self, ctx: ToolContext | None, prompt_tail: str) -> None:
        self.ctx, self.prompt_tail = ctx, prompt_tail


class ToolSchemaDrafter:
    """Drafts from tool schemas (module docstring). ``tokenizer``: the model's HF tokenizer
    (``decode(ids)``, ``encode(text, add_special_tokens=False)``)."""

    name = "tools"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._req: dict[str, _ReqTools] = {}

    def _state(self, seq: Sequence) -> _ReqTools:
        st = self._req.get(seq.request_id)
        if st is None:
            text = self.tokenizer.decode(seq.token_ids[:seq.num_prompt])
            st = _ReqTools(tool_context_or_none(text), text[-PROMPT_TAIL_CHARS:])
            self._req[seq.request_id] = st
        return st

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """Up to ``k`` tokens of the text the schema predicts next, or None."""
        st = self._state(seq)
        if st.ctx is None or k < 1:
            return None
        out = seq.token_ids[seq.num_prompt:]
        tail = (st.prompt_tail if len(out) <= OUTPUT_TAIL_TOKENS else "") + self.tokenizer.decode(
            out[-OUTPUT_TAIL_TOKENS:])
        text = next_literal(tail, st.ctx)
        if not text:
            return None
        tokens = self.tokenizer.encode(text, add_special_tokens=False)[:k]
        return Draft(list(tokens)) if tokens else None

    def release(self, seq: Sequence) -> None:
        """Forget the request's parsed tools."""
        self._req.pop(seq.request_id, None)
