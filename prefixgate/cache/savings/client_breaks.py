"""The client's cache breaks: where a session's prompt, as the client sent it, stopped reusing
the previous request's prefix — and only where that cost the backend something (issue 37).

Two views of each request, one :class:`~prefixgate.cache.savings.breaks.BreakDetector` each:

- the **client's body** names the cause: the kind, the masked excerpt and the line are the
  client's text, never prefixgate's rewrite of it;
- the **body sent upstream** says whether the backend lost anything: a client break that the
  rewrite bridged (the hoisted clock) cost nothing and is not reported, and a divergence only the
  rewrite made (its first hoist) is prefixgate's own, never the client's (the passes' stage
  credits account for it, :mod:`prefixgate.proxy.observe.insight`).

Where the backend gave its own token ids of what was sent (``POST /tokenize``, our engine and
vLLM), they decide: the prefix broke only when the previous request's ids are not a prefix of the
new ones, ``token_offset`` is the length of the shared ids — counted from the start of the
rendered prompt, chat template included, in the backend's own tokenizer: what the engine's
radix cache matches and reports as cached tokens (page size 1) — and ``tokens_lost`` the
previous request's ids after it (``unit = "engine"``). Without ids the detector's estimate
stays (``unit = "estimate"``: the model's tiktoken encoding over the blocks in the API's order).

Bounded: sessions as the detectors keep them (LRU), and at most :data:`MAX_IDS` token ids kept
over all sessions (the least recently seen session's dropped first).
"""

from __future__ import annotations

import dataclasses
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from prefixgate.cache.provider_models.prefix_blocks import Api, TokenCounter, detect_api, flatten
from prefixgate.cache.savings.breaks import BreakDetector, BreakRecord

MAX_IDS = 8 << 20
"""Token ids kept over all sessions (4 bytes each: 32 MiB)."""


def shared_ids(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i < n:  # compare slices a chunk at a time (C speed), then id by id in the last one
        j = min(n, i + step)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while a[i] == b[i]:
            i += 1
        return i
    return n


def _as_ids(ids: Sequence[int] | None) -> array[int] | None:
    """``ids`` as a compact array (None when absent or not 32-bit token ids)."""
    if ids is None:
        return None
    try:
        return array("I", ids)
    except (OverflowError, TypeError):
        return None


class ClientBreaks:
    """Per process: the client's breaks that cost the backend something (module docstring).

    ``store_text``: the detectors keep raw excerpts too (policy ``store_prompt_text``);
    ``max_sessions``: sessions each detector remembers; ``max_ids``: token ids kept in all."""

    def __init__(self, store_text: bool = False, max_sessions: int = 4096,
                 max_ids: int = MAX_IDS) -> None:
        self.client = BreakDetector(store_text=store_text, max_sessions=max_sessions)
        self.sent = BreakDetector(max_sessions=max_sessions)
        self.max_ids = max_ids
        self._ids: OrderedDict[str, array[int]] = OrderedDict()
        self._held = 0

    def observe(self, session: str, original: dict[str, Any], sent: dict[str, Any],
                count: TokenCounter, api: Api | None = None,
                sent_ids: Sequence[int] | None = None) -> BreakRecord | None:
        """The client's break of this request, or None. ``original``: the client's body;
        ``sent``: the body sent upstream (the same object when not rewritten); ``sent_ids``: the
        backend's token ids of ``sent`` when it gave them. Raises ``TypeError`` on malformed
        messages (as the detector does)."""
        api = api or detect_api(original)
        blocks = flatten(original, api, count)
        mine = self.client.observe(session, original, count, api, blocks)
        theirs = self.sent.observe(session, sent, count, api,
                                   blocks if sent is original else None)
        now = _as_ids(sent_ids)
        prev = self._swap_ids(session, now)
        if mine is None:
            return None
        if prev is not None and now is not None:
            shared = shared_ids(prev, now)
            if shared >= min(len(prev), len(now)):
                return None  # the backend's own ids still extend the previous request's
            return dataclasses.replace(mine, token_offset=shared, tokens_lost=len(prev) - shared,
                                       unit="engine")
        if theirs is None:
            return None  # the rewrite bridged it: the backend lost nothing
        return dataclasses.replace(mine, token_offset=theirs.token_offset,
                                   tokens_lost=theirs.tokens_lost)

    def _swap_ids(self, session: str, ids: array[int] | None) -> array[int] | None:
        """The session's previous ids (None: unknown); keeps ``ids`` in their place."""
        prev = self._ids.pop(session, None)
        if prev is not None:
            self._held -= len(prev)
        if ids is not None and len(ids) <= self.max_ids:
            self._ids[session] = ids
            self._held += len(ids)
            while self._held > self.max_ids:
                _, gone = self._ids.popitem(last=False)
                self._held -= len(gone)
        return prev
