"""After a request: why did its prefix stop matching, what would the client's own body have
cached, and which pass made what reusable? The answers go to the ledger (never prompt text
unless the policy stores it).

- Breaks: :class:`prefixgate.cache.savings.client_breaks.ClientBreaks` compares the client's body
  with the session's previous one and names the first divergence (volatile span, reorder, tool
  set, ...), kept only when what was sent upstream lost reuse too (prefixgate's own rewrite is
  never the client's break); in the backend's own tokens where it tokenizes.
- Counterfactual, one model per REAL cache (DESIGN.md, *Savings, measured honestly*; issue 19,
  item 3): a provider or engine prefix cache is shared by every request of an organisation's key
  (OpenAI, Anthropic) or of an engine (ours, vLLM, llama.cpp), never by one conversation only, so
  a prefix that another conversation's identical system prompt and tools left in the cache is a
  hit the client's own body would have had too. The client's ORIGINAL bodies therefore go into
  one model per partition (:func:`partition_key`: backend + deployment) with the provider's rules,
  TTL and capacity (:func:`prefixgate.cache.provider_models.make_model`), across sessions;
  tenants and ``cache_salt`` s are kept apart inside it the way the engine keeps them
  (:func:`backend_salt`: the salt the backend receives, as a prefix no other salt shares).
  ``cf_cached_tokens`` is its estimate; the saving is ``cached_tokens - cf_cached_tokens``, in
  money ``cf_input_usd - input_usd`` (prompt prices from :mod:`prefixgate.config.prices`).
- For self-hosted engines that tokenize (``POST /tokenize``,
  :mod:`prefixgate.proxy.observe.engine_tokens`) the original request's REAL token ids go through
  the partition's radix tree (:mod:`prefixgate.cache.provider_models.token_radix`) instead: no
  chat-template approximation. The block model is still fed, so a later tokenize failure falls
  back on a model that saw the traffic.
- Measured wins: when the backend sees the client's own prompt — the body went as sent, or the
  rewritten body's token ids (tokenizing engines) / cache blocks in the provider's rendered order
  and its other fields (the others) equal the original's (``Analysis.same_as_sent``; e.g. tool
  schemas re-keyed for a template that renders them with sorted keys) — the row's own cached
  tokens are its counterfactual (:mod:`prefixgate.proxy.pipeline.record`), less what earlier
  rewriting left in the cache: the sum of the row's stage-chain credits, which is exactly 0
  while no pass has changed bytes in the partition (then the figure is purely measured) and is
  the modelled after-effect otherwise (a route whose passes stood back finds the cache warm with
  rewritten prefixes and cold for the client's: ``bench/counterfactual_check.py --scripted``
  measured a 0.07 error in the cached share when that was ignored). Requests not rewritten on
  purpose (holdout, opted out) are measured as they are.
- Attribution (issue 19, item 5): the stage chain. Rule, exact and stated once: the passes run in
  pipeline order p1..pK; stage k is the body after p1..pk (:mod:`prefixgate.proxy.observe.stages`
  re-runs them with the rewrite's context; stage 0 is the client's body). Each stage has its own
  cache model in the partition, fed that stage's body of every request, so stage k's model is
  the cache of a world where every request went through p1..pk. Pass pk is credited
  ``credit_k = cached_k - cached_(k-1)`` tokens (its marginal reuse given the passes before it;
  negative when it broke a prefix). The credits telescope: they sum to ``cached_K - cached_0``,
  the modelled saving, and what the backend's measured figure differs by is the named remainder
  (:data:`prefixgate.cache.ledger.attribution.UNATTRIBUTED`). A pass whose stage body has never differed
  from the one before it has no model of its own (it IS the previous stage's cache) and gets
  exactly 0; the first time it changes bytes, its model starts as a copy of the previous stage's
  (``CacheModel.clone``), so it inherits the history it would have had. Once it has a model, a
  request it left alone can still move its credit, through what its earlier changes left in
  the cache (that is where they pay, or cost).

Every estimate says where it came from (ledger ``cf_source``): ``modelled`` (a model above); the
proxy sets ``measured`` when the backend saw the client's own prompt; ``holdout`` rows are those
of sessions sent unrewritten on purpose; ``""`` when there is none.

About 3 ms per 6k-token request (token counting, memoised across stages and requests), the
stage bodies rendered from the stages the rewrite recorded (one more run of the passes only for
a rewrite function that records none), plus one or two local HTTP calls (tokenize the original,
and the rewritten body to compare); run after the answer has been sent
(:mod:`prefixgate.proxy.pipeline.after_answer`), so it adds nothing to TTFT nor to a non-streamed
answer's latency. Failures are logged and never fail a request.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prefixgate.cache.provider_models import CacheModel, CacheOutcome, make_model
from prefixgate.cache.provider_models.prefix_blocks import (
    PrefixBlock,
    anthropic_blocks,
    detect_api,
    flatten,
    memo_counter,
    openai_blocks,
)
from prefixgate.cache.provider_models.radix import rendered_order
from prefixgate.cache.provider_models.token_radix import TokenCaches
from prefixgate.cache.savings.client_breaks import ClientBreaks
from prefixgate.cache.savings.cost import UnknownPriceError, price_outcome
from prefixgate.proxy.core.errors import Api
from prefixgate.proxy.core.offload import off_loop
from prefixgate.proxy.http.tenants import salts, tenant_salt
from prefixgate.proxy.observe.engine_tokens import EngineTokenizer
from prefixgate.proxy.observe.stages import PASS_NAMES, recorded_bodies, stage_bodies
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import Upstream
from prefixgate.rewriter.analysis.tokens import TokenCounter, encoding_for_model, make_counter
from prefixgate.rewriter.types import Context

log = logging.getLogger("prefixgate.insight")

MAX_PARTITIONS = 64
GAP_WINDOW_S = 300.0
"""How long after a skipped analysis (shed under load, a body too large to analyse) a real
cache's modelled counterfactuals are withheld: the skipped request's prefix never reached the
model, so a later request it would have warmed would be modelled uncached and its hit claimed as
a saving. 300 s is the longest hosted prompt-cache TTL in the default table (5 min); rows in the
window keep their measured counterfactual (a body sent as is) and carry no modelled one."""
"""Partitions (deployments) whose models are kept; the least recently used goes beyond."""


@dataclass(frozen=True)
class Analysis:
    """``cf_cached_tokens``: cached tokens the client's original body would have got;
    ``cf_input_usd``: its prompt's price (None when the model has no price); ``brk``: the
    break record dict, or None; ``cf_source``: ``"modelled"`` when there is an estimate, else
    ``""``; ``cf_from_tokens``: the estimate ran on the backend's own token ids;
    ``credits``: tokens each pass made reusable by the stage-chain rule (module docstring),
    ``{pass: tokens}`` (signed), None when not attributed; ``same_as_sent``: the backend saw
    the client's own prompt (module docstring, *Measured wins*)."""

    cf_cached_tokens: int | None = None
    cf_input_usd: float | None = None
    brk: dict[str, Any] | None = None
    cf_source: str = ""
    cf_from_tokens: bool = False
    credits: Mapping[str, int] | None = None
    same_as_sent: bool = False


def partition_key(target: Target) -> str:
    """The real cache ``target``'s requests share: backend + deployment (one engine, or one
    organisation's key on a hosted API). Tenants are kept apart inside it by salt."""
    return f"{target.backend_name}\x00{target.deployment_name}"


def backend_salt(target: Target, tenant: str, body: Mapping[str, Any]) -> str:
    """The ``cache_salt`` the backend receives for a body the client sent with ``body``'s salt:
    the tenant's folded salt where the backend is salted (:mod:`prefixgate.proxy.http.tenants`),
    else the client's own (vLLM and our engine honour it), "" for none."""
    own = body.get("cache_salt")
    client = own if isinstance(own, str) else None
    if tenant and salts(target.backend):
        return tenant_salt(tenant, client)
    return client or ""


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


def model_blocks(provider: str, body: dict[str, Any], count: TokenCounter,
                 salt: str = "") -> list[PrefixBlock]:
    """``body`` flattened as ``provider``'s model flattens it (Anthropic and OpenAI by their
    API; a radix engine by the body's own), with a 0-token block of ``salt`` in front for a
    radix engine (salted prefixes never meet; the salt costs no tokens)."""
    if provider == "anthropic":
        return anthropic_blocks(body, count)
    if provider == "openai":
        return openai_blocks(body, count)
    blocks = flatten(body, detect_api(body), count)
    if salt:
        digest = hashlib.sha256(("cache_salt\x00" + salt).encode("utf-8", "surrogatepass"))
        blocks.insert(0, PrefixBlock("system", -1, 0, "salt", None, 0, digest.hexdigest()))
    return blocks


def shared_texts(blocks: list[PrefixBlock], pool: dict[str, str]) -> list[PrefixBlock]:
    """``blocks`` with each text replaced by ``pool``'s string of the same digest (the first one
    seen becomes it): what the break detector and the cache models keep of one request then
    holds each distinct text once (issue 34 item 17: a 1 MB prompt was kept twice, once per
    structure, ~3 MB per session with the token memo). ``pool``: digest -> text, one analysis's."""
    out = []
    for b in blocks:
        text = pool.setdefault(b.sha256, b.text)
        out.append(b if text is b.text else replace(b, text=text))
    return out


def seen_as(provider: str, blocks: Sequence[PrefixBlock]) -> list[tuple[str, str | None]]:
    """What the provider's cache sees of ``blocks``: digests and breakpoint TTLs, in its
    rendered order (system -> tools -> messages for OpenAI's format and chat templates)."""
    order = blocks if provider == "anthropic" else rendered_order(list(blocks))
    return [(b.sha256, b.cache_ttl) for b in order]


def _params(body: Mapping[str, Any]) -> dict[str, Any]:
    """A body's fields other than its prompt (``prompt_cache_key``, ``tool_choice``, ...): a
    pass that changes one changes what the backend does with the prompt."""
    return {k: v for k, v in body.items() if k not in ("messages", "tools", "system")}


@dataclass
class _Partition:
    """One real cache: the model fed the client's bodies (stage 0) and, per pass that has
    changed bytes here, the model fed the bodies after that pass (the stage chain)."""

    base: CacheModel
    chain: dict[str, CacheModel] = field(default_factory=dict)


class Insight:
    """Break detector + counterfactual cache models of one proxy process; thread-safe.
    ``tokenizer``: the client of backends' ``/tokenize`` (default: a fresh one)."""

    def __init__(self, store_text: bool = False, tokenizer: EngineTokenizer | None = None) -> None:
        self.breaks = ClientBreaks(store_text=store_text)
        self.tokenizer = tokenizer if tokenizer is not None else EngineTokenizer()
        self._parts: OrderedDict[str, _Partition] = OrderedDict()
        self._token_caches = TokenCaches()
        self._counters: dict[str, TokenCounter] = {}
        self._lock = threading.Lock()
        self._gaps: dict[str, float] = {}  # partition -> monotonic time of its last skipped analysis
        self.clock = time.monotonic

    def note_gap(self, partition: str) -> None:
        """A request of the real cache ``partition`` (:func:`partition_key`) was answered without
        its analysis: withhold that cache's modelled counterfactuals for :data:`GAP_WINDOW_S`."""
        with self._lock:
            self._gaps[partition] = self.clock()
            while len(self._gaps) > MAX_PARTITIONS:
                self._gaps.pop(next(iter(self._gaps)))

    def _gapped(self, partition: str) -> bool:
        """Whether ``partition`` skipped an analysis within :data:`GAP_WINDOW_S` (call locked)."""
        at = self._gaps.get(partition)
        return at is not None and self.clock() - at < GAP_WINDOW_S

    def _counter(self, model: str) -> TokenCounter:
        enc = encoding_for_model(model)
        if enc not in self._counters:
            self._counters[enc] = memo_counter(make_counter(enc))
        return self._counters[enc]

    def _partition(self, key: str, provider: str, count: TokenCounter) -> _Partition:
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Partition(make_model(provider, count))
            while len(self._parts) > MAX_PARTITIONS:
                self._parts.popitem(last=False)
        self._parts.move_to_end(key)
        return part

    async def analyze(self, upstream: Upstream, target: Target, *, api: Api, session: str,
                      model: str, original: dict[str, Any], sent: dict[str, Any],
                      budget_ms: int, max_depth: int, inline: bool = False, tenant: str = "",
                      view: dict[str, Any] | None = None,
                      ctx: Context | None = None,
                      recorded: Sequence[tuple[str, Any, bool]] = ()) -> Analysis:
        """The :class:`Analysis` of one finished request, off the event loop: the backend's
        token ids of ``original`` (and of ``sent`` when it differs) when it tokenizes
        (:mod:`prefixgate.proxy.observe.engine_tokens`, bounded by the tokenizer's timeout),
        then :meth:`observe` in a worker thread under ``budget_ms`` (over it: an empty
        Analysis). ``max_depth``: JSON nesting limit for the bridge. ``inline``: run
        :meth:`observe` on the loop instead (a small body whose token counter is loaded: ~0.05
        ms of work for 1 KB, less than the thread hop; see :meth:`warm_for`). ``tenant``: the
        request's; ``view`` / ``ctx``: the pass body the rewrite started from and its context
        (None: not rewritten), for the stage chain; ``recorded``: the stages the rewrite
        recorded (:func:`prefixgate.proxy.observe.stages.recorded_bodies`; empty: re-run)."""
        ids = await self.tokenizer.ids(upstream, target, api, original, max_depth)
        sent_ids = None
        if ids and sent is not original:
            sent_ids = await self.tokenizer.ids(upstream, target, api, sent, max_depth)
        fn = functools.partial(self.observe, session=session, backend=target.backend_name,
                               provider=target.provider, api=api, model=model,
                               original=original, sent=sent, token_ids=ids, sent_ids=sent_ids,
                               salt=backend_salt(target, tenant, original),
                               partition=partition_key(target), view=view, ctx=ctx,
                               budget_ms=budget_ms, recorded=recorded)
        if inline and self.warm_for(model) and (ctx is None or sent is original):
            return fn()
        return await off_loop(fn, budget_ms, Analysis())

    def warm_for(self, model: str) -> bool:
        """Whether ``model``'s token counter is loaded (a first load takes ~0.7 s, so until then
        the analysis runs off the event loop whatever the body's size)."""
        return encoding_for_model(model) in self._counters

    def observe(self, *, session: str, backend: str, provider: str, api: str, model: str,
                original: dict[str, Any], sent: dict[str, Any],
                token_ids: Sequence[int] | None = None, salt: str = "",
                sent_ids: Sequence[int] | None = None, partition: str | None = None,
                view: dict[str, Any] | None = None, ctx: Context | None = None,
                budget_ms: int = 1000,
                recorded: Sequence[tuple[str, Any, bool]] = ()) -> Analysis:
        """The :class:`Analysis` of one finished request.

        ``session``: hashed session id (what the break record will carry); ``original``: the
        client's body; ``sent``: the body after rewriting (same API, before any translation;
        the same object when not rewritten); ``token_ids`` / ``sent_ids``: the backend's own
        ids of ``original`` / ``sent`` when it gave them; ``salt``: the ``cache_salt`` the
        backend receives (:func:`backend_salt`); ``partition``: the real cache
        (:func:`partition_key`; default: the backend); ``view`` / ``ctx``: see
        :meth:`analyze`; ``budget_ms``: the analysis's; the stage re-run must end within its
        first half (else nothing is attributed, and the counterfactual is still made);
        ``recorded``: the rewrite's own stages (used instead of the re-run when given).
        """
        start = time.monotonic()
        count = self._counter(model)  # a first load takes ~0.7 s: the stages may get none
        stages = None
        if ctx is not None and view is not None and sent is not original:
            stages = recorded_bodies(view, recorded, sent) if recorded else stage_bodies(
                view, api, ctx, sent, start + budget_ms / 2000)  # type: ignore[arg-type]
        cf: CacheOutcome | None = None
        brk: dict[str, Any] | None = None
        credits: dict[str, int] | None = None
        same = sent is original
        pool: dict[str, str] = {}  # one string per distinct block text, shared by all we keep
        with self._lock:
            try:
                now_ids = sent_ids if sent_ids is not None else (
                    token_ids if sent is original else None)
                rec = self.breaks.observe(session, original, sent, count,
                                          api, now_ids)  # type: ignore[arg-type]
                brk = rec.to_dict() if rec is not None else None
                if brk is not None and brk["unit"] == "estimate":  # which counter estimated it
                    brk["tokenizer"] = encoding_for_model(model)
            except Exception:
                log.exception("break detection failed")
            key = partition if partition is not None else backend
            try:
                part = self._partition(key, provider, count)
                cf, credits, same_blocks = self._chain(part, provider, count, salt, original,
                                                       sent, stages, pool)
                same = same or (not token_ids and same_blocks)
            except Exception:
                log.exception("counterfactual cache model failed")
            from_tokens = False
            if token_ids:
                try:
                    cf = self._token_caches.process(key, token_ids, salt)
                    from_tokens = True
                    same = same or (sent_ids is not None and list(sent_ids) == list(token_ids))
                except Exception:
                    log.exception("token counterfactual failed")
            if self._gapped(key):  # the model misses a skipped request's prefix: no estimate
                cf, credits = None, None
        if ctx is None:  # not rewritten on purpose (holdout, opted out, off): measured as is
            credits = {}
        if cf is None:
            return Analysis(brk=brk, credits=credits, same_as_sent=same)
        try:
            usd: float | None = price_outcome(cf, model).input_usd
        except UnknownPriceError:
            usd = None
        return Analysis(cf.cached_read_tokens, usd, brk, "modelled", from_tokens, credits, same)

    def _chain(self, part: _Partition, provider: str, count: TokenCounter, salt: str,
               original: dict[str, Any], sent: dict[str, Any],
               stages: list[tuple[str, dict[str, Any]]] | None, pool: dict[str, str] | None = None,
               ) -> tuple[CacheOutcome, dict[str, int] | None, bool]:
        """Feed the partition's stage-0 model the client's body and each stage model its
        stage's body (module docstring, *Attribution*). Returns (stage-0 outcome, credits or
        None when the stages are unknown, whether the provider sees ``sent`` as ``original``)."""
        now = time.time()
        texts = pool if pool is not None else {}
        memo: dict[int, list[PrefixBlock]] = {id(original): shared_texts(
            model_blocks(provider, original, count, salt), texts)}

        def blocks(body: dict[str, Any]) -> list[PrefixBlock]:
            got = memo.get(id(body))
            if got is None:
                got = memo[id(body)] = shared_texts(model_blocks(provider, body, count, salt), texts)
            return got

        base = blocks(original)
        same = sent is original or (_params(sent) == _params(original)
                                    and seen_as(provider, blocks(sent)) == seen_as(provider, base))
        if stages is None:  # not rewritten: every stage is the client's body; else unknown
            plan = [(n, original if sent is original else sent) for n in PASS_NAMES]
        else:
            plan = stages
        views = [seen_as(provider, blocks(b)) for _, b in plan]
        # a pass changing bytes here for the first time: its cache so far IS the previous one's
        last: CacheModel = part.base
        fresh: dict[str, CacheModel] = {}
        prev_view = seen_as(provider, base)
        for (name, _), view in zip(plan, views):
            model = part.chain.get(name)
            if model is None and view != prev_view and stages is not None:
                model = fresh[name] = last.clone()
            if model is not None:
                last = model
            prev_view = view
        part.chain.update(fresh)
        out0 = part.base.process(original, now, base)
        credits: dict[str, int] = {}
        prev = out0
        for name, body in plan:
            model = part.chain.get(name)
            if model is None:
                continue  # identical to the previous stage's cache: credit 0
            out = model.process(body, now, blocks(body))
            credits[name] = out.cached_read_tokens - prev.cached_read_tokens
            prev = out
        if sent is original:  # nothing rewritten now: the credits are earlier changes' effects
            return out0, credits, True
        return out0, (credits if stages is not None else None), same
