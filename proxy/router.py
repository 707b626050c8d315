"""Pick the backend for a request and say how to reach it.

:func:`pick_target` applies the policy's routes (first matching model glob wins, see
:func:`config.loader.resolve_route`) and returns a :class:`Target`: the backend, the cache rules
that apply to it (``provider``), and the upstream URL for the client's API. It raises
:class:`~proxy.errors.ModelNotFound` (404) when no route matches and
:class:`~proxy.errors.NotSupported` (501) when the backend cannot take the client's API.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from config.loader import resolve_route
from config.schema import Backend, Policy
from config.secrets import MissingSecret, resolve_secret
from proxy.errors import Api, MissingBackendKey, ModelNotFound, NotSupported

# Whose prefix-cache rules a backend follows (cache/provider_models, rewriter Context.provider).
PROVIDER_OF_KIND = {"anthropic": "anthropic", "openai": "openai", "openai_compat": "radix",
                    "local": "radix"}


@dataclass(frozen=True)
class Target:
    """Where one request goes.

    ``route``: the matching glob; ``backend_name``: key in ``policy.backends``; ``wire``: the
    API the upstream speaks (``"openai"`` or ``"anthropic"``); ``translate``: True when the
    client's API differs from ``wire``.
    """

    route: str
    backend_name: str
    backend: Backend
    provider: str
    wire: Api
    translate: bool

    def url(self) -> str:
        """Upstream URL: ``base_url`` + ``/chat/completions`` or ``/messages``."""
        path = "/messages" if self.wire == "anthropic" else "/chat/completions"
        return self.backend.base_url + path

    def api_key(self) -> str | None:
        """The backend's own key, resolved now. Raises MissingBackendKey (500) when unset."""
        try:
            return resolve_secret(self.backend.api_key)
        except MissingSecret as e:
            raise MissingBackendKey(f"backend {self.backend_name!r}: {e}") from None


def pick_target(policy: Policy, model: str, api: Api, *, can_translate: bool = False) -> Target:
    """Route ``model`` for a client speaking ``api``; see module docstring for errors.

    ``can_translate``: whether a client may be served by a backend of the other API (through
    :mod:`proxy.translate`); without it such a route is a 501.
    """
    hit = resolve_route(policy, model)
    if hit is None:
        raise ModelNotFound(f"The model '{model}' does not exist or no route of the policy "
                            "matches it.", param="model")
    name, backend = hit
    glob = next(r.match for r in policy.routes
                if r.backend == name and fnmatch.fnmatchcase(model, r.match))
    wire: Api = "anthropic" if backend.kind == "anthropic" else "openai"
    if wire != api and not can_translate:
        raise NotSupported(f"model '{model}' routes to backend '{name}' ({backend.kind}), which "
                           f"does not serve the {api} API through this proxy", param="model")
    return Target(glob, name, backend, PROVIDER_OF_KIND[backend.kind], wire, wire != api)
