"""One model request end to end: prepare -> send -> answer -> record, for every endpoint.

A newcomer reads a request's path here in one screen; each step is a call into the module that
owns it, the request's state in one :class:`~prefixgate.proxy.pipeline.exchange.Exchange`::

    prepare  pipeline.prepare   proxy key, rate limits (401 / 429), tenant; body read once
                                under max_body_bytes and its deadline, JSON (numbers exact),
                                nesting, the endpoint's checks (400 / 408 / 413); route ->
                                targets (404 / 501); default output cap; session id and the
                                rewriter's passes (fail-open, under rewrite.time_budget_ms);
                                one bridge + upstream bytes per target (400)
    send     pipeline.send      fan-out gate, then routing.retries: deployment (affinity +
                                load guard, breakers), retries with backoff, the next
                                deployment / backend, all before the first byte reaches the
                                client (502 / 504); abandoned when the client leaves (499)
    answer   pipeline.answer    the upstream's error in the client's shape, SSE event by
                                event, or the JSON answer mapped by the bridge; TTFT / TPOT
    record   pipeline.record    one ledger row (usage, cost, engine timings, attempts),
                                session memory, metrics, cache breaks + counterfactual;
                                for a JSON answer all but session memory run once the
                                answer is sent (pipeline.after_answer)

Invariants (issue 8, classes 1 and 7): whatever can fail on the client's body fails before the
send; from the send on, the upstream response is closed on every path
(:func:`prefixgate.proxy.pipeline.answer.answer`, then the relay); each request writes exactly one
ledger row whose ``http_status`` is the status of the response the client got (499 when it got
none).
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from prefixgate.proxy.pipeline.answer import answer, refuse
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.prepare import prepare
from prefixgate.proxy.pipeline.send import send


async def run(state: ProxyState, request: Request, ex: Exchange) -> Response:
    """Serve ``ex`` (made by the endpoint) end to end (module docstring)."""
    try:
        await prepare(ex, request, state)                               # prepare
        resp = await send(ex, request, state)                           # send (with retries)
    except BaseException as e:
        return refuse(state, ex, e)
    return await answer(state, ex, resp)                                # answer, record
