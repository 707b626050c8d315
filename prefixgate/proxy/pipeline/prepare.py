"""The prepare step: everything that can fail on the client's request fails here, before the send.

:func:`prepare` runs, in order: the proxy key and rate limits (401 / 429), the tenant, the body
read once under its limits and checked (:func:`parse`: 400 / 408 / 413), the route and its
targets (404 / 501), the route's default output cap, the session id and the rewriter's passes
(:func:`passes`, off the event loop under the rewrite budget, fail-open), and one bridge + upstream
bytes per target (:func:`bridges`: 400 when the primary cannot carry the request).
"""

from __future__ import annotations

import time

from fastapi import Request

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Policy
from prefixgate.proxy.bridges.base import bridge_for
from prefixgate.proxy.core.errors import Api, ProxyError
from prefixgate.proxy.core.offload import off_loop
from prefixgate.proxy.http import body as wire
from prefixgate.proxy.http.body import check_nesting, read_body_within
from prefixgate.proxy.http.tenants import namespaced_session, salted_body, tenant_for
from prefixgate.proxy.pipeline.edit_detail import edit_detail_headers
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.holdout import in_holdout
from prefixgate.proxy.pipeline.output_cap import with_default_cap
from prefixgate.proxy.pipeline.record import pass_tokens_json
from prefixgate.proxy.pipeline.rewrite import rewrite_off_loop, rewrite_wanted, session_hash, session_id_for
from prefixgate.proxy.routing.retries import Step
from prefixgate.proxy.routing.router import plan_targets
from prefixgate.rewriter.types import Context


async def prepare(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Auth, parse, route, passes, bridges: everything that can fail on the client's request
    fails here, before anything is sent."""
    ex.row.key_id = await state.guard.admit(request.headers, ex.api)   # 401 / 429
    ex.row.tenant = tenant_for(request.headers, ex.row.key_id, state.policy, state.guard)
    await parse(ex, request, state.policy)
    ex.targets = plan_targets(state.policy, ex.row.model, ex.api, can_translate=True)
    ex.row.route, ex.row.backend = ex.targets[0].route, ex.targets[0].backend_name
    # a body without an output cap gets the route's (pipeline.output_cap)
    ex.body, ex.raw = with_default_cap(ex.body, ex.raw, ex.api, ex.targets[0], state.policy)
    await passes(ex, request, state)
    ex.steps = bridges(ex, state.policy.limits.max_json_depth)
    for s in ex.steps:  # the tenant's prefix-cache namespace on the backend (http.tenants)
        if s.target.wire == "openai":
            s.body = salted_body(s.body, ex.row.tenant, s.target.backend)


async def parse(ex: Exchange, request: Request, policy: Policy) -> None:
    """Read the body once within the body deadline (400 / 408 / 413), check its nesting
    before any pass or bridge and what the proxy relies on (400)."""
    ex.raw = await read_body_within(request, policy.max_body_bytes, policy.limits.body_timeout_s)
    ex.obs.read_done = time.perf_counter()
    ex.body = wire.parse_json(ex.raw)
    await check_nesting(ex.body, policy.limits.max_json_depth, len(ex.raw))
    (wire.check_anthropic if ex.api == "anthropic" else wire.check_openai)(ex.body)
    ex.row.model, ex.row.stream = ex.body["model"], wire.is_stream(ex.body)


async def passes(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Session id and the rewriter's passes (for the primary backend's cache rules), off the
    event loop under the rewrite time budget (fail-open: never raises for a pass; over budget
    the client's bytes go out)."""
    policy, primary = state.policy, ex.targets[0]
    ex.session_id = namespaced_session(ex.row.tenant, session_id_for(request.headers, ex.body))
    ex.row.session = session_hash(ex.session_id)
    ctx = None
    ex.row.holdout = in_holdout(ex.session_id, policy.holdout)  # A/B: sent as if opted out
    ex.row.cf_source = "holdout" if ex.row.holdout else ""
    if rewrite_wanted(request.headers, policy.rewrite) and not ex.row.holdout:
        ctx = Context(settings=policy.rewrite, model=ex.row.model, provider=primary.provider,
                      session_id=ex.session_id, session=await state.sessions.aget(ex.session_id),
                      now_s=time.time(), masks_tools=traits(primary.backend.kind).masks_tools)
    ex.rw = await rewrite_off_loop(state.rewrite_fn, ex.body, ex.raw, ex.api, ctx)
    ex.row.rewrite, ex.row.edits, ex.row.tokens_pruned = ctx is not None, ex.rw.summary, ex.rw.pruned
    if policy.rewrite.edit_detail_header and ctx is not None:  # opt-in (pipeline.edit_detail)
        ex.obs.headers = await off_loop(lambda: edit_detail_headers(ex.body, ex.rw, ex.api),
                                        policy.rewrite.time_budget_ms, None)
    ex.row.pass_tokens = pass_tokens_json(ex.rw.edits)


def bridges(ex: Exchange, max_depth: int) -> list[Step]:
    """One :class:`Step` per target: its bridge and upstream bytes. The primary's bridge
    failing is the client's 400; a fallback that cannot carry the request is left out.
    ``max_depth``: policy ``limits.max_json_depth``, also applied to JSON a bridge parses out
    of strings."""
    assert ex.rw is not None
    steps: list[Step] = []
    made: dict[tuple[Api, str | None], bytes] = {}
    for i, t in enumerate(ex.targets):
        bridge = bridge_for(ex.api, t.wire)
        try:
            if (t.wire, t.model) not in made:
                made[(t.wire, t.model)] = bridge.encode(ex.rw.body, ex.rw.raw, t.model, max_depth)
        except ProxyError as e:
            if i == 0:
                raise
            ex.attempts.failed(t.backend_name, f"bridge-{type(e).__name__}")
            continue
        steps.append(Step(t, bridge, made[(t.wire, t.model)]))
    return steps
