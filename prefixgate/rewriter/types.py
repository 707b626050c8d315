"""Shared types of the rewrite pipeline: :class:`Edit`, :class:`Context`, :class:`RewriteResult`.

A pass is a pure function ``(Prompt, Context) -> (Prompt, list[Edit])``. It never does I/O: it
reads session memory through ``Context.session`` (read-only) and proposes memory updates in its
Edits' ``memory`` field; the proxy writes them back after the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.analysis.tokens import TokenCounter, count_tokens

Api = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Edit:
    """What one pass did (or why it did nothing).

    ``pass_name``: e.g. ``"canonicalize_tools"``; ``applied``: False when the pass left the prompt
    unchanged (``detail`` says why); ``region``: ``"tools" | "system" | "messages" | "params"``;
    ``tokens_before`` / ``tokens_after``: tokens of the region touched (for pruning: removed =
    before - after); ``memory``: session-memory updates for the proxy to write back;
    ``tokens_reusable``: prompt tokens the pass made reusable from the prefix cache (its own
    estimate, for savings attribution; a lower bound where counting stopped early);
    ``tokens_added``: tokens the pass added to the prompt (a note, placeholders).
    """

    pass_name: str
    applied: bool
    region: str
    detail: str
    tokens_before: int = 0
    tokens_after: int = 0
    memory: Mapping[str, Any] = field(default_factory=dict)
    tokens_reusable: int = 0
    tokens_added: int = 0

    @property
    def tokens_removed(self) -> int:
        """Tokens the edit took out of the prompt (0 for moves and reorders)."""
        return max(0, self.tokens_before - self.tokens_after)


@dataclass(frozen=True)
class Context:
    """Everything a pass may read besides the prompt.

    ``settings``: the policy's rewrite switches; ``model``: requested model id; ``provider``:
    whose cache rules apply (``"anthropic" | "openai" | "radix"``); ``session``: read-only view of
    this session's memory (JSON-like values); ``count_tokens``: text -> tokens.
    """

    settings: RewriteSettings
    model: str = ""
    provider: str = "radix"
    session_id: str = ""
    session: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    count_tokens: TokenCounter = count_tokens
    betas: tuple[str, ...] = ()
    """Anthropic beta flags of the request (``anthropic-beta`` header, comma list split), read
    by the breakpoint planner where a beta changes caching rules (case B20)."""
    now_s: float | None = None
    """Wall-clock time of the request, seconds (epoch, or simulated time in the simulator);
    None = unknown: no arrival times are learned (:mod:`prefixgate.rewriter.analysis.ttl_choice`)."""
    masks_tools: bool = False
    """The backend masks tool calls at decode time (our local engine honours OpenAI's
    ``allowed_tools`` tool_choice): ``prune_tools`` then keeps the whole tool list (its
    prefix-cache bytes) and sends the set it would keep as ``allowed_tools``."""
    deadline: float | None = None
    """``time.monotonic()`` second past which the pipeline stops before its next pass and the
    request goes out as sent (:class:`prefixgate.rewriter.pipeline.OverBudget`); None = no limit."""
    memo: Any = None
    """A :class:`prefixgate.rewriter.region_memo.RegionMemo` the pipeline keeps the stable
    region's pass outputs and hash in across requests (the proxy's, shared by its requests);
    None = every request computed afresh. Either way the same bytes come out."""


@dataclass
class RewriteResult:
    """Output of :func:`prefixgate.rewriter.rewrite_request`.

    ``body``: the wire body to send upstream (same API as the input); ``edits``: every pass's
    Edit in pipeline order; ``stable_prefix_hash``: hex sha256 of the rendered stable region
    (tools + system) after rewriting, for prefix affinity and ``prompt_cache_key``;
    ``stages``: ``(pass name, prompt IR after it, whether it applied)`` for each pass that ran,
    in order (:func:`prefixgate.rewriter.pipeline.run_passes`; empty when none ran), so the
    after-answer attribution reads the stage chain instead of running the passes again.
    """

    body: dict[str, Any]
    edits: list[Edit]
    stable_prefix_hash: str = ""
    stages: tuple[tuple[str, Any, bool], ...] = ()

    def summary(self) -> str:
        """Short ASCII text for headers (``x-prefixgate-edits``) and the ledger.

        ``;``-separated items in pipeline order: ``name`` or ``name:count`` per applied pass,
        ``-N`` appended when it removed N tokens (e.g. ``prune_tools:1-812``), ``!name`` for a
        pass that was reverted or failed (fail-open), and ``none`` when nothing applied.
        """
        applied: dict[str, list[int]] = {}
        failed: list[str] = []
        for e in self.edits:
            if e.applied:
                c = applied.setdefault(e.pass_name, [0, 0])
                c[0] += 1
                c[1] += e.tokens_removed
            elif e.detail.startswith(("pass failed", "output invalid")):
                failed.append(e.pass_name)
        items = []
        for n, (count, removed) in applied.items():
            item = n if count == 1 else f"{n}:{count}"
            items.append(f"{item}-{removed}" if removed else item)
        items.extend(f"!{n}" for n in failed if n not in applied)
        text = ";".join(items) or "none"
        return text.encode("ascii", "replace").decode()

    @property
    def tokens_removed(self) -> int:
        """Tokens removed by all applied edits (pruning)."""
        return sum(e.tokens_removed for e in self.edits if e.applied)
