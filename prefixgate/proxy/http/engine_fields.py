"""Engine-to-engine body fields are never a client's (issue 34, items 2, 11, 12).

Some request fields are a contract between prefixgate and the engines it drives, not between a
client and a model:

- ``kv_transfer_params`` (vLLM's P/D contract: a prefill answer's transfer id, its first token
  ids, the remote engine's address), ``first_token_ids``, and SGLang's ``bootstrap_host`` /
  ``bootstrap_port`` / ``bootstrap_room`` (any ``bootstrap_*``): prefixgate's P/D driver
  (:mod:`prefixgate.proxy.routing.pd.drive`) writes them. A client's own would be relayed on
  the colocated path, so a tenant could make a decode engine wait on a transfer that never
  comes (another tenant's request queued behind it) or emit chosen text as model output.
  :func:`refuse_engine_fields` answers such a body with a 400 naming the field, on every
  backend (a hosted API has no use for them either).
- ``id_slot`` (llama.cpp's slot): on a backend that pins slots the proxy names the slot
  (:func:`prefixgate.proxy.routing.slots.with_id_slot` replaces a client's), so one tenant can
  neither pick nor evict the slot another's conversation is pinned to.
"""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.core.errors import InvalidRequest

__all__ = ["ENGINE_FIELDS", "refuse_engine_fields"]

ENGINE_FIELDS = ("kv_transfer_params", "first_token_ids")
ENGINE_PREFIXES = ("bootstrap_",)


def engine_field(body: dict[str, Any]) -> str | None:
    """The first top-level key of ``body`` that belongs to the engine-to-engine contract
    (module docstring), None when there is none."""
    for key in body:
        if key in ENGINE_FIELDS or (isinstance(key, str) and key.startswith(ENGINE_PREFIXES)):
            return str(key)
    return None


def refuse_engine_fields(body: dict[str, Any]) -> None:
    """Raise :class:`InvalidRequest` (400, ``param`` the field) when a client's ``body`` holds
    a field prefixgate sets between its engines (module docstring)."""
    key = engine_field(body)
    if key is not None:
        raise InvalidRequest(f"'{key}' is set by prefixgate between the engines it drives "
                             "(prefill / decode disaggregation); a client may not send it.",
                             param=key, code="unsupported_parameter")
