"""After a request: why did its prefix stop matching, and what would the client's own body have
cached? Both answers go to the ledger (never prompt text unless the policy stores it).

- Breaks: :class:`cache.breaks.BreakDetector` compares the body sent upstream with the session's
  previous one and names the first divergence (volatile span, reorder, tool set, ...).
- Counterfactual: one provider cache model per backend (:func:`cache.provider_models.make_model`,
  the backend's rules: Anthropic, OpenAI or a radix engine) is fed the client's ORIGINAL bodies,
  so ``cf_cached_tokens`` estimates the cached tokens without rewriting. Rewriting's saving is
  ``cached_tokens - cf_cached_tokens``.

About 3 ms per 6k-token request (token counting); run after the answer has been relayed, so it
adds nothing to TTFT. Failures are logged and never fail a request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cache.breaks import BreakDetector
from cache.provider_models import CacheModel, make_model
from rewriter.tokens import TokenCounter, encoding_for_model, make_counter

log = logging.getLogger("prefixgate.insight")


class Insight:
    """Break detector + counterfactual cache models of one proxy process; thread-safe."""

    def __init__(self, store_text: bool = False) -> None:
        self.detector = BreakDetector(store_text=store_text)
        self._models: dict[str, CacheModel] = {}
        self._counters: dict[str, TokenCounter] = {}
        self._lock = threading.Lock()

    def _counter(self, model: str) -> TokenCounter:
        enc = encoding_for_model(model)
        if enc not in self._counters:
            self._counters[enc] = make_counter(enc)
        return self._counters[enc]

    def observe(self, *, session: str, backend: str, provider: str, api: str, model: str,
                original: dict[str, Any], sent: dict[str, Any]
                ) -> tuple[int | None, dict[str, Any] | None]:
        """Returns ``(cf_cached_tokens or None, break record dict or None)``.

        ``session``: hashed session id (what the break record will carry); ``original``: the
        client's body; ``sent``: the body after rewriting (same API, before any translation).
        """
        count = self._counter(model)
        cf: int | None = None
        brk: dict[str, Any] | None = None
        with self._lock:
            try:
                rec = self.detector.observe(session, sent, count, api)  # type: ignore[arg-type]
                brk = rec.to_dict() if rec is not None else None
            except Exception:
                log.exception("break detection failed")
            try:
                cm = self._models.get(backend)
                if cm is None:
                    cm = self._models[backend] = make_model(provider, count)
                cf = cm.process(original, time.time()).cached_read_tokens
            except Exception:
                log.exception("counterfactual cache model failed")
        return cf, brk
