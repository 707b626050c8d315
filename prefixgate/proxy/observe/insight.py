"""After a request: why did its prefix stop matching, and what would the client's own body have
cached? Both answers go to the ledger (never prompt text unless the policy stores it).

- Breaks: :class:`prefixgate.cache.breaks.BreakDetector` compares the body sent upstream with the session's
  previous one and names the first divergence (volatile span, reorder, tool set, ...).
- Counterfactual: one provider cache model per backend (:func:`prefixgate.cache.provider_models.make_model`,
  the backend's rules: Anthropic, OpenAI or a radix engine) is fed the client's ORIGINAL bodies,
  so ``cf_cached_tokens`` estimates the cached tokens without rewriting. Rewriting's saving is
  ``cached_tokens - cf_cached_tokens``; in money, ``cf_input_usd - input_usd`` (prompt prices
  from :mod:`prefixgate.config.prices`; output is the same either way).
- For self-hosted engines that tokenize (``POST /tokenize``, :mod:`prefixgate.proxy.observe.engine_tokens`),
the
  original request's REAL token ids go through a per-session radix tree
  (:mod:`prefixgate.cache.provider_models.token_radix`) instead: no chat-template approximation. The block
  model is still fed, so a later tokenize failure falls back on a model that saw the session.

Every estimate says where it came from (ledger ``cf_source``): ``modelled`` (either model
above); the proxy sets ``measured`` when the client's own body went upstream (its cached tokens
are the counterfactual); ``holdout`` rows are those of sessions sent unrewritten on purpose;
``""`` when there is none.

About 3 ms per 6k-token request (token counting) plus one local HTTP call; run after the answer
has been relayed, so it adds nothing to TTFT. Failures are logged and never fail a request.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefixgate.cache.breaks import BreakDetector
from prefixgate.cache.cost import UnknownPriceError, price_outcome
from prefixgate.cache.provider_models import CacheModel, CacheOutcome, make_model
from prefixgate.cache.provider_models.token_radix import SessionTokenCaches
from prefixgate.proxy.core.errors import Api
from prefixgate.proxy.core.offload import off_loop
from prefixgate.proxy.observe.engine_tokens import EngineTokenizer
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import Upstream
from prefixgate.rewriter.tokens import TokenCounter, encoding_for_model, make_counter

log = logging.getLogger("prefixgate.insight")


@dataclass(frozen=True)
class Analysis:
    """``cf_cached_tokens``: cached tokens the client's original body would have got;
    ``cf_input_usd``: its prompt's price (None when the model has no price); ``brk``: the
    break record dict, or None; ``cf_source``: ``"modelled"`` when there is an estimate, else
    ``""``; ``cf_from_tokens``: the estimate ran on the backend's own token ids."""

    cf_cached_tokens: int | None = None
    cf_input_usd: float | None = None
    brk: dict[str, Any] | None = None
    cf_source: str = ""
    cf_from_tokens: bool = False


def input_cost_usd(model: str, prompt: int | None, cached: int | None,
                   written: int | None) -> float | None:
    """USD of a prompt from the backend's own usage (uncached, cache reads, 5-minute cache
    writes) with the dated table in :mod:`prefixgate.config.prices`; None when unpriced or unreported."""
    if prompt is None:
        return None
    read, write = cached or 0, written or 0
    try:
        outcome = CacheOutcome(prompt, read, write, max(0, prompt - read - write))
        return price_outcome(outcome, model).input_usd
    except (UnknownPriceError, ValueError):
        return None


class Insight:
    """Break detector + counterfactual cache models of one proxy process; thread-safe.
    ``tokenizer``: the client of backends' ``/tokenize`` (default: a fresh one)."""

    def __init__(self, store_text: bool = False, tokenizer: EngineTokenizer | None = None) -> None:
        self.detector = BreakDetector(store_text=store_text)
        self.tokenizer = tokenizer if tokenizer is not None else EngineTokenizer()
        self._models: dict[str, CacheModel] = {}
        self._token_caches = SessionTokenCaches()
        self._counters: dict[str, TokenCounter] = {}
        self._lock = threading.Lock()

    def _counter(self, model: str) -> TokenCounter:
        enc = encoding_for_model(model)
        if enc not in self._counters:
            self._counters[enc] = make_counter(enc)
        return self._counters[enc]

    async def analyze(self, upstream: Upstream, target: Target, *, api: Api, session: str,
                      model: str, original: dict[str, Any], sent: dict[str, Any],
                      budget_ms: int, max_depth: int, inline: bool = False) -> Analysis:
        """The :class:`Analysis` of one finished request, off the event loop: the backend's
        token ids of ``original`` when it tokenizes (:mod:`prefixgate.proxy.observe.engine_tokens`, bounded
        by the tokenizer's timeout), then :meth:`observe` in a worker thread under ``budget_ms``
        (over it: an empty Analysis). ``max_depth``: JSON nesting limit for the bridge.
        ``inline``: run :meth:`observe` on the loop instead (a small body whose token counter is
        loaded: ~0.05 ms of work for 1 KB, less than the thread hop; see :meth:`warm_for`)."""
        ids = await self.tokenizer.ids(upstream, target, api, original, max_depth)
        salt = original.get("cache_salt")
        fn = functools.partial(self.observe, session=session, backend=target.backend_name,
                               provider=target.provider, api=api, model=model,
                               original=original, sent=sent, token_ids=ids,
                               salt=salt if isinstance(salt, str) else "")
        if inline and self.warm_for(model):
            return fn()
        return await off_loop(fn, budget_ms, Analysis())

    def warm_for(self, model: str) -> bool:
        """Whether ``model``'s token counter is loaded (a first load takes ~0.7 s, so until then
        the analysis runs off the event loop whatever the body's size)."""
        return encoding_for_model(model) in self._counters

    def observe(self, *, session: str, backend: str, provider: str, api: str, model: str,
                original: dict[str, Any], sent: dict[str, Any],
                token_ids: Sequence[int] | None = None, salt: str = "") -> Analysis:
        """The :class:`Analysis` of one finished request.

        ``session``: hashed session id (what the break record will carry); ``original``: the
        client's body; ``sent``: the body after rewriting (same API, before any translation);
        ``token_ids``: the backend's own ids of ``original`` when it gave them (then the
        counterfactual is the per-session token radix tree's, keyed by backend, session and the
        request's ``cache_salt`` ``salt``).
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
            from_tokens = False
            if token_ids:
                try:
                    cf = self._token_caches.process(f"{backend}\x00{session}\x00{salt}", token_ids)
                    from_tokens = True
                except Exception:
                    log.exception("token counterfactual failed")
        if cf is None:
            return Analysis(brk=brk)
        try:
            usd: float | None = price_outcome(cf, model).input_usd
        except UnknownPriceError:
            usd = None
        return Analysis(cf.cached_read_tokens, usd, brk, "modelled", from_tokens)
