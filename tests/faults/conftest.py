"""Fixtures: the fault-injecting upstream and a proxy in front of it, both on loopback.

Routes (the model name picks the fault, see :mod:`tests.faults.fault_server`):
``claude-patient/*`` and ``patient/*`` -> Anthropic / OpenAI-compatible backends with a 30 s
timeout (for faults the client gives up on first); ``claude-*`` -> an Anthropic backend and
everything else -> an OpenAI-compatible one, both with a 1 s timeout. Rewriting and the
after-answer analysis are off: these tests are about the request's life, not its body.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.server import uvicorn_options
from tests.faults.fault_server import FaultServer, serve_faults
from tests.servers import serve_app

FAST_TIMEOUT_S = 1.0
# Unreachable: no fault lasts this long, so a counter that moves proves the peer hung up first.
STALL_S = 30.0


@dataclass
class FaultRig:
    """``url``: proxy base URL; ``upstream``: the fault server; ``ledger``."""

    url: str
    upstream: FaultServer
    ledger: Ledger

    def gauge(self, name: str, labels: str = "") -> float:
        """The value of metric ``name{labels}`` on the proxy's ``/metrics``; KeyError when the
        proxy does not export it."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        want = name + (f"{{{labels}}}" if labels else "")
        for line in text.splitlines():
            m = re.fullmatch(r"(\S+) (\S+)", line)
            if m and m.group(1) == want:
                return float(m.group(2))
        raise KeyError(want)


@pytest.fixture
def faults(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FaultRig]:
    """The rig on uvicorn's default server; a test parametrized indirectly with ``"serve"``
    gets it on ``prefixgate serve``'s stack instead (the guarded httptools protocol and the
    policy's limits, :func:`prefixgate.proxy.http.server.uvicorn_options`)."""
    stack = getattr(request, "param", "default")
    up = FaultServer(stall_s=STALL_S)
    with serve_faults(up) as up_url:
        def backend(kind: str, timeout_s: float) -> dict[str, Any]:
            return {"kind": kind, "base_url": up_url + "/v1", "timeout_s": timeout_s}

        policy = parse_policy({
            "backends": {"oa": backend("openai_compat", FAST_TIMEOUT_S),
                         "an": backend("anthropic", FAST_TIMEOUT_S),
                         "oa-patient": backend("openai_compat", STALL_S),
                         "an-patient": backend("anthropic", STALL_S)},
            "routes": [{"match": "claude-patient/*", "backend": "an-patient"},
                       {"match": "patient/*", "backend": "oa-patient"},
                       {"match": "claude-*", "backend": "an"},
                       {"match": "*", "backend": "oa"}],
            "ledger": {"path": str(tmp_path / "ledger.sqlite")},
        })
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
        options = uvicorn_options(policy.limits) if stack == "serve" else {}
        with serve_app(app, **options) as url:
            yield FaultRig(url, up, ledger)


def body_for(path: str, model: str, stream: bool, **extra: Any) -> dict[str, Any]:
    """A minimal valid request body for ``path``'s API."""
    body: dict[str, Any] = {"model": model, "stream": stream,
                            "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 8
    body.update(extra)
    return body
