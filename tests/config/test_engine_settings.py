"""Issue 33: ``engine.span_reuse: on|off`` (default on) reaches the engines ``prefixgate serve``
spawns as ``--span-reuse on|off``; with it on, the moves are not on for local routes (they ship
``guarded``: off until a trial on the route shows answers keep, issue 36)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prefixgate.config.loader import PolicyError, default_policy, load_policy
from prefixgate.config.schema import MOVES_THE_MODEL_READS, switch_on


def _policy(tmp_path: Path, engine: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text("backends:\n  local: {kind: local, base_url: 'http://127.0.0.1:9/v1', spawn: true,"
                 f" model_path: /m}}\nroutes:\n  - {{match: '*', backend: local}}\n{engine}"
                 f"ledger: {{path: '{tmp_path / 'l.sqlite'}'}}\n")
    return p


def test_span_reuse_is_on_by_default_and_the_moves_are_off() -> None:
    pol = default_policy()
    assert pol.engine.span_reuse is True
    assert all(getattr(pol.rewrite, m) == "guarded" and not switch_on(pol.rewrite, m)
               for m in MOVES_THE_MODEL_READS)


@pytest.mark.parametrize(("text", "want"), [("off", False), ("on", True), ("'off'", False),
                                            ("false", False), ("'ON'", True)])
def test_on_and_off_read_as_yaml_writes_them(tmp_path: Path, text: str, want: bool) -> None:
    pol = load_policy(_policy(tmp_path, f"engine: {{span_reuse: {text}}}\n"))
    assert pol.engine.span_reuse is want


@pytest.mark.parametrize("text", ["maybe", "1", "[on]"])
def test_anything_else_is_refused_with_its_path(tmp_path: Path, text: str) -> None:
    with pytest.raises(PolicyError) as e:
        load_policy(_policy(tmp_path, f"engine: {{span_reuse: {text}}}\n"))
    assert "engine.span_reuse" in str(e.value)


@pytest.mark.parametrize(("engine", "flag"), [("", "on"), ("engine: {span_reuse: off}\n", "off")])
def test_serve_passes_the_setting_to_each_spawned_engine(tmp_path: Path, monkeypatch: Any,
                                                         engine: str, flag: str) -> None:
    import uvicorn

    from prefixgate.proxy.cli import app
    from prefixgate.proxy.cli import serve as cmd_serve

    spawned: list[list[str]] = []

    @contextmanager
    def fake_engine(backend: Any, model_dir: str, extra: list[str] | None = None, **_: Any) -> Any:
        spawned.append(list(extra or []))
        yield None

    monkeypatch.setattr(cmd_serve, "EngineProcess", fake_engine)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    res = CliRunner().invoke(app, ["serve", "--policy", str(_policy(tmp_path, engine))])
    assert res.exit_code == 0, res.output
    assert len(spawned) == 1  # one engine, given the setting (after serve's own logging flags)
    i = spawned[0].index("--span-reuse")
    assert spawned[0][i:i + 2] == ["--span-reuse", flag]


def test_local_routes_get_the_clients_bytes_with_the_shipped_defaults() -> None:
    """A session whose clock changes every turn: with the shipped defaults no pass moves it (the
    engine's span reuse bridges it), so the system text goes out as the client wrote it."""
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    rules = "Follow the airline policy. Be brief. Verify the user id first. " * 30
    memory: dict[str, Any] = {}
    for minute in range(10, 14):
        system = f"You are Helper. The current time is 2025-03-04 10:{minute}:00 EST. {rules}"
        body = {"model": "SmolLM2-135M-Instruct", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "Q"}]}
        r = rewrite_request(body, "openai", Context(default_policy().rewrite, model=body["model"],
                                                    provider="radix", session=memory))
        memory.update(session_updates(r))
        assert r.body["messages"][0]["content"] == system
        assert not any(e.applied and e.pass_name in MOVES_THE_MODEL_READS for e in r.edits)
