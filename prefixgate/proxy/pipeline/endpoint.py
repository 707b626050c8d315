"""What a model endpoint declares; the pipeline runs the rest (envoy ai-gateway's endpoint spec).

Every model endpoint — chat completions, messages, responses, completions, embeddings,
count_tokens — passes the same steps (:mod:`prefixgate.proxy.pipeline`): prepare (auth, rate
limits, tenant, body, route, output cap, passes, one bridge per target) -> send (deployments,
breakers, retries, fallbacks, fan-out gate) -> answer -> record. An :class:`Endpoint` only says
what differs: the client's API, the backend path, what the proxy checks in the body, whether the
rewriter's passes and the cache analysis apply, and whether the request is a model call with a
ledger row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from prefixgate.proxy.bridges import BridgeApi
from prefixgate.proxy.core.errors import Api


@dataclass(frozen=True)
class Endpoint:
    """One model endpoint's spec (module docstring).

    ``api``: the client's error shape; ``client``: its API for the bridges; ``path``: the path
    at a backend speaking the same API; ``check``: the body checks the proxy relies on (raises
    InvalidRequest, 400); ``passes``: the rewriter's passes apply; ``bridged``: a backend of
    another API may serve it (False: such a route is a 501 naming ``path``); ``cap``: whose
    default output-cap field applies (``openai``, ``responses``, ``completions``; None: no
    cap); ``salted``: a tenant's ``cache_salt`` goes on bodies sent in Chat Completions form;
    ``analyze``: run the cache-break / counterfactual analysis after the answer; ``ledger``: a
    model call, recorded as one ledger row (False: count_tokens); ``streams``: the API can answer
    as a stream when the body asks (False: embeddings, count_tokens answer JSON whatever
    ``stream`` says, so a ``stream: true`` there is not read as one).
    """

    api: Api
    client: BridgeApi
    path: str
    check: Callable[[dict[str, Any]], None]
    passes: bool = True
    bridged: bool = True
    cap: Literal["openai", "responses", "completions"] | None = None
    salted: bool = True
    analyze: bool = True
    ledger: bool = True
    streams: bool = True
