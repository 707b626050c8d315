"""After a request: why did its prefix stop matching, and what would the client's own body have
cached? Both answers go to the ledger (never prompt text unless the policy stores it).

- Breaks: :class:`cache.breaks.BreakDetector` compares the body sent upstream with the session's
  previous one and names the first divergence (volatile span, reorder, tool set, ...).
- Counterfactual: one provider cache model per backend (:func:`cache.provider_models.make_model`,
  the backend's rules: Anthropic, OpenAI or a radix engine) is fed the client's ORIGINAL bodies,
  so ``cf_cached_tokens`` estimates the cached tokens without rewriting. Rewriting's saving is
  ``cached_tokens - cf_cached_tokens``; in money, ``cf_input_usd - input_usd`` (prompt prices
  from :mod:`config.prices`; output is the same either way).

About 3 ms per 6k-token request (token counting); run after the answer has been relayed, so it
adds nothing to TTFT. Failures are logged and never fail a request.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from cache.breaks import BreakDetector
from cache.cost import UnknownPriceError, price_outcome
from cache.provider_models import CacheModel, CacheOutcome, make_model
from rewriter.tokens import TokenCounter, encoding_for_model, make_counter

log = logging.getLogger("prefixgate.insight")


@dataclass(frozen=True)
class Analysis:
    """``cf_cached_tokens``: cached tokens the client's original body would have got;
    ``cf_input_usd``: its prompt's price (None when the model has no price); ``brk``: the
    break record dict, or None."""

    cf_cached_tokens: int | None = None
    cf_input_usd: float | None = None
    brk: dict[str, Any] | None = None


def input_cost_usd(model: str, prompt: int | None, cached: int | None,
                   written: int | None) -> float | None:
    """USD of a prompt from the backend's own usage (uncached, cache reads, 5-minute cache
    writes) with the dated table in :mod:`config.prices`; None when unpriced or unreported."""
    if prompt is None:
        return None
    read, write = cached or 0, written or 0
    try:
        outcome = CacheOutcome(prompt, read, write, max(0, prompt - read - write))
        return price_outcome(outcome, model).input_usd
    except (UnknownPriceError, ValueError):
        return None


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

    def warm_for(self, model: str) -> bool:
        """Whether ``model``'s token counter is loaded (a first load takes ~0.7 s: then the
        analysis must run off the event loop whatever the body's size)."""
        return encoding_for_model(model) in self._counters

    def observe(self, *, session: str, backend: str, provider: str, api: str, model: str,
                original: dict[str, Any], sent: dict[str, Any]) -> Analysis:
        """The :class:`Analysis` of one finished request.

        ``session``: hashed session id (what the break record will carry); ``original``: the
        client's body; ``sent``: the body after rewriting (same API, before any translation).
        """
        count = self._counter(model)
        cf: CacheOutcome | None = None
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
                cf = cm.process(original, time.time())
            except Exception:
                log.exception("counterfactual cache model failed")
        if cf is None:
            return Analysis(brk=brk)
        try:
            usd: float | None = price_outcome(cf, model).input_usd
        except UnknownPriceError:
            usd = None
        return Analysis(cf.cached_read_tokens, usd, brk)
