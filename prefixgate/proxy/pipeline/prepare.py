"""The prepare step: everything that can fail on the client's request fails here, before the send.

:func:`prepare` runs, in order, for every endpoint (:class:`~prefixgate.proxy.pipeline.endpoint.Endpoint`):
the proxy key (401), the tenant, the body read once under its limits and checked (:func:`parse`:
400 / 408 / 413), the rate limits with the prompt's estimate charged (429), the route and its
targets (:func:`targets`: 404 / 501), the route's default output cap, the session id and the
rewriter's passes over the primary bridge's pass body (:func:`passes`, off the event loop under
the rewrite budget, fail-open; the passes that add tokens switched off while the route's
stand-back holds, :mod:`prefixgate.cache.savings.stand_back`; each ``guarded`` move on or off by
the meaning guard's verdict for the route and tenant, :mod:`prefixgate.proxy.pipeline.guard_moves`),
and one bridge + upstream bytes per target
(:func:`bridges`: 400 when the primary cannot carry the request; a fallback that cannot is left
out).
"""

from __future__ import annotations

import time
from typing import Any

import anyio.to_thread
from fastapi import Request

from prefixgate.cache.savings.stand_back import KEEP, Verdict
from prefixgate.config.backend_kinds import traits
from prefixgate.config.guard_settings import MOVES
from prefixgate.config.schema import Policy, RewriteSettings
from prefixgate.proxy.bridges import Bridge, bridge_for
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import NotSupported, ProxyError, TenantSaltUnavailable
from prefixgate.proxy.core.offload import off_loop
from prefixgate.proxy.http import body as wire
from prefixgate.proxy.http.body import check_nesting, read_body_within
from prefixgate.proxy.http.engine_fields import refuse_engine_fields
from prefixgate.proxy.http.tenants import namespaced_session, salted_body, tenant_for
from prefixgate.proxy.pipeline.edit_detail import edit_detail_headers
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.guard_moves import GUARD_HEADER, resolve_moves
from prefixgate.proxy.pipeline.holdout import in_holdout
from prefixgate.proxy.pipeline.output_cap import with_default_cap
from prefixgate.proxy.pipeline.record import pass_tokens_json
from prefixgate.proxy.pipeline.rewrite import RewriteOutcome, rewrite_off_loop, rewrite_wanted
from prefixgate.proxy.pipeline.session_key import session_hash, session_id_for
from prefixgate.proxy.routing.retries import Step
from prefixgate.proxy.routing.router import Target, plan_targets
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.passes.breakpoints import CACHE_PARAMS, DIAGNOSTICS_MEMORY
from prefixgate.rewriter.pipeline import PASSES
from prefixgate.rewriter.region_memo import RegionMemo
from prefixgate.rewriter.token_memo import TokenMemo
from prefixgate.rewriter.types import Context, Edit


async def prepare(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Auth, parse, route, passes, bridges (module docstring)."""
    ex.row.key_id = await state.guard.admit(request.headers, ex.api)   # 401
    ex.row.tenant = tenant_for(request.headers, ex.row.key_id, state.policy, state.guard)
    await parse(ex, request, state.policy)
    # 429; the prompt's estimate charged with the check, settled by Exchange.record (http.auth)
    ex.ticket = await state.guard.limit(ex.row.key_id, ex.body, len(ex.raw), ex.endpoint.ledger)
    if ex.ticket is not None:
        ex.ticket.progress = ex.output_seen
    ex.targets = targets(ex, state.policy)
    ex.row.route, ex.row.backend = ex.targets[0].route, ex.targets[0].backend_name
    if ex.endpoint.cap is not None:  # a body without an output cap gets the route's
        args = (ex.body, ex.raw, ex.endpoint.cap, ex.targets[0], state.policy)
        ex.body, ex.raw = (await anyio.to_thread.run_sync(with_default_cap, *args)
                           if len(ex.raw) > wire.OFF_LOOP_BYTES else with_default_cap(*args))
    await passes(ex, request, state)
    ex.steps = bridges(ex, state.policy.limits.max_json_depth)
    if ex.endpoint.salted:  # the tenant's prefix-cache namespace on the backend (http.tenants)
        ex.steps = salted_steps(ex, state)


def salted_steps(ex: Exchange, state: ProxyState) -> list[Step]:
    """The steps with the tenant's keyed ``cache_salt`` on the bodies of backends that take one
    (:func:`prefixgate.proxy.http.tenants.salted_body`). Without a salt secret (fail closed,
    :mod:`prefixgate.proxy.http.salt_key`) the primary's step raises TenantSaltUnavailable
    (424) and a fallback's is left out (``tenant-salt-unavailable``): never sent unsalted."""
    assert state.salt_key is not None
    out = []
    for i, s in enumerate(ex.steps):
        if s.bridge.wire == "openai":
            try:
                s.body = salted_body(s.body, ex.row.tenant, s.target.backend, state.salt_key)
            except TenantSaltUnavailable:
                if i == 0:
                    raise
                ex.attempts.failed(s.target.backend_name, "tenant-salt-unavailable")
                continue
        out.append(s)
    return out


async def parse(ex: Exchange, request: Request, policy: Policy) -> None:
    """Read the body once within the body deadline (400 / 408 / 413), check its nesting
    before any pass or bridge and what the proxy relies on (the endpoint's ``check``, 400);
    a field of the engine-to-engine contract is refused (400,
    :mod:`prefixgate.proxy.http.engine_fields`)."""
    ex.raw = await read_body_within(request, policy.max_body_bytes, policy.limits.body_timeout_s)
    ex.obs.read_done = time.perf_counter()
    ex.body = await wire.parse_json_off_loop(ex.raw)  # a large body's parse off the loop
    await check_nesting(ex.body, policy.limits.max_json_depth, len(ex.raw))
    ex.endpoint.check(ex.body)
    ex.row.model = ex.body["model"]
    ex.row.stream = ex.endpoint.streams and wire.is_stream(ex.body)
    refuse_engine_fields(ex.body)  # P/D contract fields are prefixgate's, never a client's


def targets(ex: Exchange, policy: Policy) -> list[Target]:
    """The route's targets for the request (404 without a route). An endpoint that cannot be
    bridged keeps only backends of its own API (501 when the primary is not one)."""
    planned = plan_targets(policy, ex.row.model, ex.api, can_translate=True, tenant=ex.row.tenant)
    if ex.endpoint.bridged:
        return planned
    same = [t for t in planned if not t.translate]
    if not planned[0].translate:
        return same
    t = planned[0]
    raise NotSupported(f"model '{ex.row.model}' routes to backend '{t.backend_name}' "
                       f"({t.backend.kind}), which has no {ex.endpoint.path.lstrip('/')} endpoint",
                       param="model")


def default_bridge(ex: Exchange, target: Target) -> Bridge:
    """The table's bridge (:func:`prefixgate.proxy.bridges.bridge_for`) for the endpoint's API on
    ``target``'s (a backend that serves the Responses API itself speaks ``responses``)."""
    client = ex.endpoint.client
    backend = target.wire
    if client == "responses" and traits(target.backend.kind).native_responses:
        backend = "responses"
    bridge = bridge_for(client, backend, ex.endpoint.path)
    if not ex.endpoint.passes:
        bridge.pass_api = None
    return bridge


def bridge_of(ex: Exchange, target: Target) -> Bridge:
    """The bridge of ``target``: the endpoint's own factory (``Exchange.bridge_of``) or the table."""
    return ex.bridge_of(ex, target) if ex.bridge_of is not None else default_bridge(ex, target)


async def passes(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Session id and the rewriter's passes over the primary bridge's pass body (for the primary
    backend's cache rules), off the event loop under the rewrite time budget (fail-open: never
    raises for a pass; over budget the client's bytes go out). An endpoint without passes gets
    the edit summary ``""`` (never rewritten)."""
    policy, primary = state.policy, ex.targets[0]
    ex.session_id = namespaced_session(ex.row.tenant, session_id_for(request.headers, ex.body))
    ex.row.session = session_hash(ex.session_id)
    ex.row.holdout = in_holdout(ex.session_id, policy.holdout)  # A/B: sent as if opted out
    ex.row.cf_source = "holdout" if ex.row.holdout else ""
    bridge = bridge_of(ex, primary)
    ex.pass_view = bridge.pass_body(ex.body) if bridge.pass_api is not None else None
    if ex.pass_view is None:
        ex.rw = RewriteOutcome(ex.body, ex.raw, "" if bridge.pass_api is None else (
            "none" if rewrite_wanted(request.headers, policy.rewrite) else "off"))
        ex.row.rewrite, ex.row.edits = False, ex.rw.summary
        ex.primary_bridge = bridge
        return
    assert bridge.pass_api is not None
    view_raw = ex.raw if ex.pass_view is ex.body else exactjson.dumps(ex.pass_view)
    ctx = None
    verdict = KEEP
    guard_edit, guard_header = None, None
    if rewrite_wanted(request.headers, policy.rewrite) and not ex.row.holdout:
        verdict = state.judge.verdict(primary.route, time.time(), ex.row.tenant)  # per tenant
        book = getattr(state.meaning_guard, "book", None) if policy.meaning_guard.enabled else None
        settings, guard_edit, guard_header = await resolve_moves(  # guarded -> on / off
            stood_back(policy.rewrite, verdict), book, primary.route, ex.row.tenant)
        ctx = Context(settings=for_route(settings, policy, primary),
                      model=ex.row.model,
                      provider=primary.provider, session_id=ex.session_id,
                      session=await state.sessions.aget(ex.session_id), now_s=time.time(),
                      masks_tools=traits(primary.backend.kind).masks_tools,
                      count_tokens=PASS_TOKENS, memo=PASS_MEMO)
    ex.ctx = ctx
    ex.resolved_settings = ctx.settings if ctx is not None else None
    ex.rw = await rewrite_off_loop(state.rewrite_fn, ex.pass_view, view_raw, bridge.pass_api, ctx)
    ask_openai_diagnostics(ex, primary)
    ex.row.rewrite, ex.row.edits, ex.row.tokens_pruned = ctx is not None, ex.rw.summary, ex.rw.pruned
    if verdict.stand_back:  # said in the Edits, the ledger and a header (cache.stand_back)
        whose = f" (tenant {ex.row.tenant})" if ex.row.tenant else ""
        ex.rw.edits.append(Edit(STAND_BACK, False, "all", f"{', '.join(verdict.passes)} off for "
                                f"route {primary.route}{whose}: {verdict.reason}"))
        ex.row.stood_back = verdict.summary()[:STAND_BACK_MAX_CHARS]
    if guard_edit is not None:  # the guarded moves' verdicts (pipeline.guard_moves)
        ex.rw.edits.append(guard_edit)
    if policy.rewrite.edit_detail_header and ctx is not None:  # opt-in (pipeline.edit_detail)
        view, api = ex.pass_view, bridge.pass_api
        ex.obs.headers = await off_loop(lambda: edit_detail_headers(view, ex.rw, api),
                                        policy.rewrite.time_budget_ms, None)
    if verdict.stand_back:
        ex.obs.headers = {**(ex.obs.headers or {}), STAND_BACK_HEADER: ex.row.stood_back}
    if guard_header is not None:
        ex.obs.headers = {**(ex.obs.headers or {}), GUARD_HEADER: guard_header}
    ex.row.pass_tokens = pass_tokens_json(ex.rw.edits)
    ex.primary_bridge = bridge


PASS_TOKENS = TokenMemo(count_tokens)
"""The passes' token counter, shared by the process's requests: a turn's texts resent by the
next turn are counted once (:mod:`prefixgate.rewriter.token_memo`; the same encoding as
``Context``'s default, so the same counts)."""
PASS_MEMO = RegionMemo()
"""The passes' stable-region memo, shared by the process's requests: a turn whose tools and
system text the proxy has seen reuses their rewrite (:mod:`prefixgate.rewriter.region_memo`;
bounded in bytes, the same bytes out as a full rewrite)."""
STAND_BACK = "stand_back"
STAND_BACK_HEADER = "x-prefixgate-stand-back"
STAND_BACK_MAX_CHARS = 300
_SWITCH = {spec.name: spec.switch for spec in PASSES}


def stood_back(settings: RewriteSettings, verdict: Verdict) -> RewriteSettings:
    """``settings`` with the passes ``verdict`` stands back from switched off (the route's
    stand-back, :mod:`prefixgate.cache.savings.stand_back`; a move ``"off"``, so a guarded one
    is not looked up); ``settings`` itself when there are none."""
    if not verdict.stand_back:
        return settings
    return settings.model_copy(update={_SWITCH[p]: "off" if _SWITCH[p] in MOVES else False
                                       for p in verdict.passes if p in _SWITCH})


def for_route(settings: RewriteSettings, policy: Policy, target: Target) -> RewriteSettings:
    """``settings`` with the route's own ``cache_diagnostics`` where it sets one."""
    route = next((r for r in policy.routes if r.match == target.route), None)
    want = route.cache_diagnostics if route is not None else None
    if want is None or want == settings.cache_diagnostics:
        return settings
    return settings.model_copy(update={"cache_diagnostics": want})


def ask_openai_diagnostics(ex: Exchange, primary: Target) -> None:
    """On a route that asks for cache diagnostics, a Responses request to a backend serving the
    Responses API itself gets ``prompt_cache_options.comparison_response_id`` = the session's
    previous response (https://developers.openai.com/api/docs/guides/prompt-caching/diagnostics;
    only a diagnostic baseline: it loads no conversation and changes no caching). Written into
    the rewritten view, which the identity bridge copies back; a client's own
    ``prompt_cache_options`` is kept; nothing on a session's first request."""
    ctx, rw = ex.ctx, ex.rw
    if ctx is None or rw is None or not ctx.settings.cache_diagnostics:
        return
    if ex.endpoint.client != "responses" or not traits(primary.backend.kind).native_responses:
        return
    mem = ctx.session.get(DIAGNOSTICS_MEMORY)
    prev = mem.get("previous_id") if isinstance(mem, dict) else None
    if not isinstance(prev, str) or not prev or "prompt_cache_options" in ex.body:
        return
    rw.body = {**rw.body, "prompt_cache_options": {"comparison_response_id": prev}}
    rw.edits.append(Edit("place_breakpoints", True, "params",
                         "prompt_cache_options.comparison_response_id=the previous response"))


def asked_diagnostics(ex: Exchange) -> bool:
    """Whether the passes added an Anthropic ``diagnostics`` request the client did not send
    (then the beta header goes with it, :mod:`prefixgate.proxy.pipeline.send`)."""
    return (ex.rw is not None and ex.pass_view is not None and "diagnostics" in ex.rw.body
            and "diagnostics" not in ex.pass_view)


def added_cache_params(view: dict[str, Any] | None, sent: dict[str, Any]) -> bool:
    """Whether the passes added OpenAI cache metadata (``prompt_cache_key`` /
    ``prompt_cache_retention``, :data:`prefixgate.rewriter.passes.breakpoints.CACHE_PARAMS`) the
    client's pass body ``view`` did not carry: a fallback whose kind does not take them
    (:mod:`prefixgate.config.backend_kinds`, ``prompt_cache_key``) then gets the client's body."""
    if view is None or sent is view:
        return False
    return any(k in sent and k not in view for k in CACHE_PARAMS)


def bridges(ex: Exchange, max_depth: int) -> list[Step]:
    """One :class:`Step` per target: its bridge and upstream bytes. The primary's bridge
    failing is the client's 400; a fallback that cannot carry the request is left out. A
    fallback whose bridge reads the same pass body as the primary's gets the rewritten body;
    another gets the client's. ``max_depth``: policy ``limits.max_json_depth``, also applied
    to JSON a bridge parses out of strings."""
    assert ex.rw is not None and ex.primary_bridge is not None
    first = ex.primary_bridge
    steps: list[Step] = []
    made: dict[tuple[type, str, str, str | None], bytes] = {}
    added = added_cache_params(ex.pass_view, ex.rw.body)
    for i, t in enumerate(ex.targets):
        try:
            bridge = first if i == 0 else bridge_of(ex, t)
            same = (ex.pass_view is not None and bridge.pass_api == first.pass_api
                    and type(bridge).pass_body is type(first).pass_body
                    and (not added or traits(t.backend.kind).prompt_cache_key))
            key = (type(bridge), bridge.wire, bridge.path, t.model)
            if key not in made or not same:
                made[key] = bridge.encode(ex.body, ex.raw, ex.rw if same else None, t.model,
                                          max_depth)
            body = made[key]
        except ProxyError as e:
            if i == 0:
                raise
            ex.attempts.failed(t.backend_name, f"bridge-{type(e).__name__}")
            continue
        steps.append(Step(t, bridge, body))
    return steps
