"""Pick the backends for a request and say how to reach them.

:func:`plan_targets` resolves the client's model (an alias first, ``policy.aliases``), applies the
policy's routes (first matching model glob wins, see :func:`prefixgate.config.loader.resolve_route`)
and returns one :class:`Target` per backend the request may use, in order: the route's own backends,
then its fallbacks. Which deployment of a group serves is decided at send time
(:mod:`prefixgate.proxy.routing.balance`, :mod:`prefixgate.proxy.routing.retries`); a Target given a
``deployment`` (:meth:`Target.on`) names it. It raises
:class:`~prefixgate.proxy.core.errors.ModelNotFound` (404) when no route matches and
:class:`~prefixgate.proxy.core.errors.NotSupported` (501) when the primary backend cannot take the
client's API.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, replace

from prefixgate.config.backend_kinds import traits
from prefixgate.config.routing import Deployment
from prefixgate.config.schema import Backend, Policy, Route
from prefixgate.config.secrets import MissingSecret, resolve_secret
from prefixgate.proxy.core.errors import (
    Api,
    Forbidden,
    MissingBackendKey,
    ModelNotFound,
    NotSupported,
)


@dataclass(frozen=True)
class Target:
    """Where one request may go.

    ``route``: the matching glob; ``backend_name``: key in ``policy.backends``; ``wire``: the
    API the upstream speaks (``"openai"`` or ``"anthropic"``); ``translate``: True when the
    client's API differs from ``wire``; ``model``: the model name to send upstream when it is
    not the client's (alias, route ``model``, fallback ``model``), else None; ``deployment``:
    the replica chosen (None: not chosen yet, the backend's own ``base_url`` / ``api_key``);
    ``tenant``: the request's tenant ("" = none), whose upstream key :meth:`api_key` sends.
    """

    route: str
    backend_name: str
    backend: Backend
    provider: str
    wire: Api
    translate: bool
    model: str | None = None
    deployment: Deployment | None = None
    tenant: str = ""

    @property
    def deployment_name(self) -> str:
        """The chosen deployment's name (the backend's name for a plain backend)."""
        return self.deployment.name if self.deployment is not None else self.backend_name

    def on(self, deployment: Deployment) -> Target:
        """This target served by ``deployment``."""
        return replace(self, deployment=deployment)

    @property
    def base_url(self) -> str:
        """The deployment's (else the backend's) API root, e.g. ``http://h:8081/v1``."""
        return self.deployment.base_url if self.deployment is not None else self.backend.base_url

    def url(self) -> str:
        """The chat endpoint's URL: ``base_url`` + ``/chat/completions`` or ``/messages`` (the
        request's bridge says where other endpoints go, ``Bridge.url``)."""
        return self.base_url + ("/messages" if self.wire == "anthropic" else "/chat/completions")

    def api_key(self) -> str | None:
        """The upstream key, resolved now: the tenant's own (``backend.tenant_keys``, the
        tenant's entry, else its base tenant's for a sub-tenant ``<tenant>/...``; on every
        deployment), else the deployment's (else the backend's) shared key — unless the backend
        has ``tenant_keys_required`` and the request has a tenant: Forbidden (403), naming no
        other tenant. Raises MissingBackendKey (424) when the chosen key's variable is unset:
        a tenant with an entry is never sent with the shared key instead (one upstream key is
        one provider cache, :mod:`prefixgate.proxy.http.tenants`)."""
        key = tenant_key(self.backend, self.tenant)
        if key is None:
            if self.tenant and self.backend.tenant_keys_required:
                raise Forbidden(f"backend {self.backend_name!r} serves tenants only with their "
                                "own upstream key, and this proxy has none for yours; ask the "
                                "operator to add one (backends.<name>.tenant_keys)")
            key = self.deployment.api_key if self.deployment is not None else self.backend.api_key
        try:
            return resolve_secret(key)
        except MissingSecret as e:
            raise MissingBackendKey(f"backend {self.backend_name!r}: {e}; set it in the proxy's "
                                    "environment and restart the proxy, or change the backend's "
                                    "api_key in the policy") from None


def tenant_key(backend: Backend, tenant: str) -> str | None:
    """The ``${ENV}`` reference of ``tenant``'s own upstream key on ``backend``: its entry in
    ``tenant_keys``, else (a sub-tenant ``acme/team-a``) its base tenant's; None without one."""
    if not tenant or not backend.tenant_keys:
        return None
    found = backend.tenant_keys.get(tenant)
    if found is None and "/" in tenant:
        found = backend.tenant_keys.get(tenant.split("/", 1)[0])
    return found


def find_route(policy: Policy, model: str) -> Route | None:
    """The first route whose glob matches ``model`` (after alias resolution), or None."""
    model = policy.aliases.get(model, model)
    return next((r for r in policy.routes if fnmatch.fnmatchcase(model, r.match)), None)


_WILDCARDS = "*?["


def did_you_mean(policy: Policy, model: str) -> str:
    """`` Did you mean 'x'?`` naming the callable model names closest to ``model`` (aliases and
    route names without wildcards, by :func:`difflib.get_close_matches`), or a route glob whose
    fixed start is close to ``model``'s; ``""`` when none is close. Names the policy makes
    callable, nothing else."""
    names = list(policy.aliases) + [r.match for r in policy.routes
                                    if not any(c in r.match for c in _WILDCARDS)]
    close = difflib.get_close_matches(model, names, n=2, cutoff=0.6)
    globs = []
    for r in policy.routes:
        fixed = r.match.split("*")[0].split("?")[0].split("[")[0]
        if fixed and fixed != r.match and difflib.SequenceMatcher(
                None, model[:len(fixed)], fixed).ratio() >= 0.6:
            globs.append(r.match)
    shown = [f"'{n}'" for n in close] + [f"a model matching '{g}'" for g in globs[:2]]
    return f" Did you mean {' or '.join(shown)}?" if shown else ""


def plan_targets(policy: Policy, model: str, api: Api, *,
                 can_translate: bool = False, tenant: str = "") -> list[Target]:
    """Every backend ``model`` may be served by for a client of ``api``, primary first (see
    module docstring for errors). ``can_translate``: whether a client may be served by a
    backend of the other API (through a bridge); without it such a fallback is left out, and
    such a primary is a 501. ``tenant``: the request's (its upstream key, :meth:`Target.api_key`)."""
    route = find_route(policy, model)
    if route is None:
        hint = did_you_mean(policy, model)
        raise ModelNotFound(f"The model '{model[:200]}' does not exist or no route of the policy "
                            f"matches it.{hint}", param="model")
    aliased = policy.aliases.get(model)
    out = []
    for i, step in enumerate(route.chain()):
        backend = policy.backends[step.backend]
        wire: Api = traits(backend.kind).wire
        if wire != api and not can_translate:
            if i == 0:
                raise NotSupported(f"model '{model}' routes to backend '{step.backend}' "
                                   f"({backend.kind}), which does not serve the {api} API "
                                   "through this proxy", param="model")
            continue
        upstream_model = step.model or aliased
        out.append(Target(route.match, step.backend, backend, traits(backend.kind).cache_provider,
                          wire, wire != api, upstream_model if upstream_model != model else None,
                          tenant=tenant))
    return out


def pick_target(policy: Policy, model: str, api: Api, *, can_translate: bool = False) -> Target:
    """The primary target of :func:`plan_targets`."""
    return plan_targets(policy, model, api, can_translate=can_translate)[0]
