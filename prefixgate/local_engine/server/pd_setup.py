"""Build an engine's P/D role from its flags (``--role``, ``--pd-*``): link, role, server hooks.

The link pairs in a background thread so the HTTP server (``/health``, the decode side's
``/v1/cache/match``) answers while the peer starts; until it is paired a prefill answer carries
``kv_transfer_params: null`` and a decode request recomputes (vLLM's recompute policy). The
thread pairs again whenever the peer is lost (a restarted decode instance pairs with the running
prefill one, ``pd/roles.py``). Both sides prove the shared secret (``pd/auth.py``:
``--pd-secret-file`` or ``$PREFIXGATE_PD_SECRET``) before any token or KV crosses the link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prefixgate.local_engine.pd.auth import load_secret
from prefixgate.local_engine.pd.link import KVLayout, PDLink
from prefixgate.local_engine.pd.roles import DecodeRole, PrefillRole
from prefixgate.local_engine.server.pd_handoff import PDHandoff

__all__ = ["layout_of", "start_role"]

log = logging.getLogger("local_engine.pd")


def layout_of(engine: Any, buffer_tokens: int) -> KVLayout:
    """The engine's KV layout (``pd.link.KVLayout``) with a ``buffer_tokens`` staging buffer."""
    pool = engine.pool
    _, heads, head_dim = pool.k[0].shape
    return KVLayout(len(pool.k), int(heads), int(head_dim), pool.page_size, pool.dtype,
                    buffer_tokens)


def start_role(engine: Any, role: str, link_url: str, peer_url: str | None, buffer_tokens: int,
               timeout_s: float, host: str, port: int, backend: str | None = None,
               secret: bytes | None = None) -> tuple[PDHandoff, Callable[[], None]]:
    """The server hooks for ``role`` and a stop function; for ``prefill`` / ``decode`` the link
    is paired (and paired again after a lost peer) in a daemon thread (pairing errors are
    logged; the engine serves on, unpaired). ``backend``: the link's (``pd.link.PDLink``; None:
    NCCL on CUDA, gloo on CPU); ``secret``: the pair's (None: ``pd.auth.load_secret()``, the
    environment). Raises ``ValueError`` for an unknown role, a prefill role without
    ``peer_url``, or no secret."""
    if role == "both":
        return PDHandoff("both"), lambda: None
    if role not in ("prefill", "decode"):
        raise ValueError(f"unknown role {role!r}")
    if engine.cache is None:
        raise ValueError("P/D roles need the prefix cache (KV enters and leaves through the tree)")
    link = PDLink(role, link_url, layout_of(engine, buffer_tokens), engine.device, timeout_s,
                  backend, secret=secret if secret is not None else load_secret())
    prole: PrefillRole | None = None
    drole: DecodeRole | None = None
    if role == "prefill":
        if not peer_url:
            raise ValueError("--role prefill needs --pd-peer-url (the decode instance)")
        prole = PrefillRole(engine, link, timeout_s)
        starter: Any = prole
    else:
        drole = DecodeRole(engine, link, timeout_s)
        starter = drole
    starter.start()  # the link thread: pairs, and pairs again after a lost peer
    hooks = PDHandoff(role, prole, drole, peer_url, engine_id=f"prefixgate-{role}-{port}",
                      host=host, port=port)

    def stop() -> None:
        starter.stop()  # a claim still waiting sees the link down and returns
        hooks.close()

    return hooks, stop
