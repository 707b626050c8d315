"""The CLI helps: config check reports every problem at once, serve validates its flags,
replay fails in one line, flags render as flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prefixgate.proxy.cli import app

BAD = """\
backends:
  local: {kind: local, base_url: http://127.0.0.1:8081/v1}
  oai: {kind: openai, base_url: https://api.openai.com/v1, api_key: "${PG_TEST_UNSET_KEY}"}
routes:
  - {match: "gpt-*", backend: opena}
  - {match: "*", backend: locl}
rewrite: {enabeld: true}
listen: {port: 99999}
"""


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})
    return r.exit_code, r.output  # stdout and stderr together


def test_config_check_reports_every_problem_in_one_run(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_TEST_UNSET_KEY", raising=False)
    f = tmp_path / "p.yaml"
    f.write_text(BAD)
    code, out = _run("config", "check", str(f))
    assert code == 1
    assert f"{f}: listen.port: " in out
    assert "rewrite.enabeld: unknown key (did you mean 'enabled'?)" in out
    assert "routes[0].backend: unknown backend 'opena'" in out
    assert "routes[1].backend: unknown backend 'locl' (did you mean 'local'?)" in out
    assert "warning: backends.oai.api_key: ${PG_TEST_UNSET_KEY} is not set" in out


def test_serve_reports_every_problem_at_start_in_config_checks_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --policy`` runs the same diagnosis (issue 22, item 4): all four mistakes in one run,
    each line as ``config check`` prints it, and nothing starts."""
    monkeypatch.delenv("PG_TEST_UNSET_KEY", raising=False)
    f = tmp_path / "p.yaml"
    f.write_text(BAD)
    _, checked = _run("config", "check", str(f))
    code, served = _run("serve", "--policy", str(f))
    assert code == 2
    problems = [line for line in checked.splitlines() if line.startswith(f"{f}: ")
                and "warning" not in line]
    assert len(problems) == 4
    for line in problems:
        assert line in served.splitlines()


def test_serve_warns_of_an_unset_backend_key_once_at_start(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_TEST_UNSET_KEY", raising=False)
    f = tmp_path / "p.yaml"
    f.write_text('backends:\n  oai: {kind: openai, base_url: "https://api.openai.com/v1", '
                 'api_key: "${PG_TEST_UNSET_KEY}"}\nroutes:\n  - {match: "gpt-*", backend: oai}\n')
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)  # start nothing
    code, out = _run("serve", "--policy", str(f))
    assert code == 0, out
    warnings = [line for line in out.splitlines() if "warning: backends.oai.api_key" in line]
    assert len(warnings) == 1 and "424" in warnings[0]


def test_config_check_names_the_file_in_yaml_errors(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("backends: {a: [1\n")
    code, out = _run("config", "check", str(f))
    assert code == 1 and f'in "{f}", line 1' in out


@pytest.mark.parametrize("args", [("--port", "99999"), ("--port", "0"),
                                  ("--log-level", "verbose")])
def test_serve_refuses_a_bad_port_or_log_level_before_starting(args: tuple[str, str]) -> None:
    code, out = _run("serve", *args)
    assert code == 2 and "Invalid value for" in out and "Traceback" not in out


def test_replay_fails_in_one_line(tmp_path: Path) -> None:
    code, out = _run("replay", str(tmp_path / "missing.json"))
    assert code == 2 and out.strip().count("\n") == 0 and "cannot read trace" in out
    code, out = _run("replay", "../shared/data/traces/tau_bench_airline_gpt4o.json",
                     "--proxy", "http://127.0.0.1:9")
    assert code == 2 and "is the proxy running at http://127.0.0.1:9?" in out


def test_flags_render_as_flags_in_help() -> None:
    code, out = _run("report", "--help")
    assert code == 0
    line = next(x for x in out.splitlines() if "--json" in x)
    assert "<bool>" not in line
    assert "<path>" in next(x for x in out.splitlines() if "--ledger" in x)


def test_a_reused_engine_must_serve_the_model_asked_for() -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from prefixgate.config.schema import Backend
    from prefixgate.proxy.cli.engine_proc import EngineProcess, EngineStartError
    from tests.servers import serve_app

    async def health(_: object) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(_: object) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "other-model"}]})

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models)])
    with serve_app(app) as url:
        backend = Backend(kind="local", base_url=url + "/v1", spawn=True)
        with pytest.raises(EngineStartError, match="serves \\['other-model'\\], not 'SmolLM2'"):
            EngineProcess(backend, "/models/SmolLM2").__enter__()
        with EngineProcess(backend, "/somewhere/other-model") as proc:
            assert proc.proc is None  # reused, not spawned


@pytest.mark.parametrize("cmd", ["serve", "engine", "config check", "config reference",
                                 "config show-default", "report", "replay", "simulate", "keys add",
                                 "keys list", "keys remove"])
def test_every_command_help_opens_with_a_summary(cmd: str) -> None:
    code, out = _run(*cmd.split(), "--help")
    lines = [x.strip(" │") for x in out.splitlines() if x.strip(" │")]
    assert code == 0 and lines[0].startswith("Usage:")
    summary = lines[1]
    assert summary[0].isupper() and not summary.startswith(("Exit", "Usage")), summary


def test_replay_takes_a_swe_agent_trace_as_simulate_does(rig: Any) -> None:
    from tests.proxy.upstream import DONE, Script, chunk

    rig.upstream.script = Script(pieces=[chunk("a"), chunk(finish="stop"), DONE])
    trace = next(Path("../shared/data/traces/swe_agent").glob("*.traj"))
    code, out = _run("replay", str(trace), "--proxy", rig.url, "--max-requests", "2",
                     "--model", "m1", "--no-cache-salt")
    assert code == 0, out
    sent = rig.upstream.seen
    assert len(sent) == 4 and all(s.json["tools"] for s in sent)


def test_serve_says_it_is_starting_the_engine_and_when_it_is_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No silent 30 s (issue 22, item 1): the engine start is announced, then timed."""
    import contextlib

    from prefixgate.proxy.cli import serve as serve_mod

    entered: list[str] = []

    @contextlib.contextmanager
    def fake_engine(backend: Any, model_dir: str, **_: Any) -> Any:
        entered.append(model_dir)
        yield None

    monkeypatch.setattr(serve_mod, "EngineProcess", fake_engine)
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)
    f = tmp_path / "p.yaml"
    f.write_text('backends:\n  local: {kind: local, base_url: "http://127.0.0.1:9/v1", spawn: true, '
                 f'model_path: "{tmp_path}"}}\nroutes:\n  - {{match: "m", backend: local}}\n')
    code, out = _run("serve", "--policy", str(f))
    assert code == 0, out and entered == [str(tmp_path)]
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("starting the local engine of backend 'local'"))
    assert lines[start].endswith("...")
    assert any(x.startswith("starting the local engine") and ": done in " in x for x in lines[start + 1:])


def test_an_interrupt_while_the_engine_loads_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C or serve's SIGTERM during the ~30 s model load left the engine running: __enter__
    # raised before the ExitStack held the process
    import sys

    from prefixgate.config.schema import Backend
    from prefixgate.proxy.cli import engine_proc

    monkeypatch.setattr(engine_proc, "engine_command", lambda *a, **k: [
        sys.executable, "-c", "import time; time.sleep(60)"])
    answers = iter([False, False])  # not serving yet; still loading, then the interrupt

    def healthy(url: str, timeout_s: float = 1.0) -> bool:
        answer = next(answers, None)
        if answer is None:
            raise KeyboardInterrupt
        return answer

    monkeypatch.setattr(engine_proc, "is_healthy", healthy)
    started = engine_proc.EngineProcess(Backend(kind="local", base_url="http://127.0.0.1:9/v1",
                                                spawn=True), "/m")
    with pytest.raises(KeyboardInterrupt):
        started.__enter__()
    assert started.proc is not None and started.proc.poll() is not None  # stopped, not left
