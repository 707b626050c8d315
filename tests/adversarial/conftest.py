"""Fixtures: the hostile upstream and a proxy in front of it (real uvicorn servers).

Routes: ``claude-*`` -> an Anthropic backend, everything else -> an OpenAI-compatible one, both
at the hostile upstream, both with a 1 s timeout. Rewriting is off unless a test turns it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.adversarial.hostile import HostileUpstream
from tests.servers import serve_app

BACKEND_KEY = "fake-backend-credential-adversarial"  # a placeholder, not a key


@dataclass
class HostileRig:
    """``url``: proxy base URL; ``upstream``: the hostile upstream; ``ledger``."""

    url: str
    upstream: HostileUpstream
    ledger: Ledger
    ledger_path: Path


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileRig]:
    monkeypatch.setenv("PG_ADV_KEY", BACKEND_KEY)
    up = HostileUpstream(hang_s=5.0)
    with serve_app(up.app()) as up_url:
        policy = parse_policy({
            "backends": {
                "oa": {"kind": "openai_compat", "base_url": up_url + "/v1",
                       "api_key": "${PG_ADV_KEY}", "timeout_s": 1},
                "an": {"kind": "anthropic", "base_url": up_url + "/v1",
                       "api_key": "${PG_ADV_KEY}", "timeout_s": 1},
            },
            "routes": [{"match": "claude-*", "backend": "an"}, {"match": "*", "backend": "oa"}],
            "ledger": {"path": str(tmp_path / "ledger.sqlite")},
        })
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=None)) as url:
            yield HostileRig(url, up, ledger, tmp_path / "ledger.sqlite")


def body_for(path: str, model: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    """A minimal valid request body for ``path``'s API."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 8
    if stream:
        body["stream"] = True
    body.update(extra)
    return body


# The scripted-upstream rig of the proxy tests (``rig``, ``rig_factory``, ``upstream``).
from tests.proxy.conftest import rig, rig_factory, upstream  # noqa: E402,F401
