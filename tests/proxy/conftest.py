"""Fixtures: a scripted upstream and a proxy in front of it, both real uvicorn servers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import Policy
from prefixgate.proxy.app import build_app
from tests.proxy.upstream import ScriptedUpstream
from tests.servers import serve_app


def make_policy(upstream_url: str, ledger_path: Path, **extra: Any) -> Policy:
    """Every model except ``claude-*`` to an OpenAI-compatible backend at ``upstream_url``;
    ``claude-*`` to an Anthropic backend at the same server; unknown models: no route."""
    data: dict[str, Any] = {
        "backends": {
            "up": {"kind": "openai_compat", "base_url": upstream_url + "/v1"},
            "anth": {"kind": "anthropic", "base_url": upstream_url + "/v1",
                     "api_key": "${PG_TEST_ANTHROPIC_KEY}"},
        },
        "routes": [{"match": "claude-*", "backend": "anth"},
                   {"match": "local*", "backend": "up"},
                   {"match": "m*", "backend": "up"},
                   {"match": "gpt-*", "backend": "up"}],
        "ledger": {"path": str(ledger_path)},
        # the scripted upstream checks bodies byte for byte: no default output cap added
        # (tests/proxy/test_bounded_defaults.py turns it on)
        "default_max_tokens": 0,
    }
    data.update(extra)
    return parse_policy(data)


@dataclass
class ProxyRig:
    """``url``: proxy base URL (no /v1); ``upstream``: the scripted upstream; ``ledger``."""

    url: str
    upstream: ScriptedUpstream
    ledger: Ledger


@pytest.fixture
def upstream() -> Iterator[tuple[ScriptedUpstream, str]]:
    up = ScriptedUpstream()
    with serve_app(up.app()) as url:
        yield up, url


@pytest.fixture
def rig_factory(tmp_path: Path, upstream: tuple[ScriptedUpstream, str],
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``rig_factory(rewrite_fn=None, **policy_extra) -> ProxyRig`` (one per test)."""
    monkeypatch.setenv("PG_TEST_ANTHROPIC_KEY", "sk-ant-backend-KEY")
    up, up_url = upstream
    stack: list[Any] = []

    def make(rewrite_fn: Any = None, **extra: Any) -> ProxyRig:
        policy = make_policy(up_url, tmp_path / "ledger.sqlite", **extra)
        ledger = Ledger(policy.ledger.path)
        cm = serve_app(build_app(policy, ledger=ledger, rewrite_fn=rewrite_fn))
        url = cm.__enter__()
        stack.append(cm)
        return ProxyRig(url, up, ledger)

    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


@pytest.fixture
def rig(rig_factory: Any) -> ProxyRig:
    """A proxy with rewriting off (no pipeline) in front of the scripted upstream."""
    return rig_factory()  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _access_log_level_restored() -> Iterator[None]:
    """``prefixgate serve`` run in-process (CliRunner) turns the access log on (and httpx's
    INFO lines off) for the whole process; later tests expect the library defaults."""
    import logging

    loggers = [logging.getLogger(name) for name in ("prefixgate.access", "httpx")]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)

