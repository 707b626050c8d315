"""A corrupt or uncreatable spool never stops the proxy (issue 34, item 8): with PostgreSQL up,
``build_app`` and ``prefixgate serve`` start, serve and record; a corrupt spool is moved aside
(``<name>.corrupt-<UTC time>-<pid>``), an uncreatable one degrades to memory, and ``/healthz``'s
``ledger`` says which (``spool``: disk or memory, ``spool_error``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.ledger_pg.pg_servers import free_port
from tests.ledger_pg.test_pg_hang import recorded, until
from tests.paths import REPO
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def bad_spool(tmp_path: Path, how: str) -> Path:
    """A spool path that is corrupt (garbage where the file is) or uncreatable (its parent is a
    file)."""
    if how == "corrupt":
        path = tmp_path / "spool.sqlite"
        path.write_bytes(b"\x00garbage, not SQLite\n" * 500)
        return path
    (tmp_path / "not-a-folder").write_text("x")
    return tmp_path / "not-a-folder" / "spool.sqlite"


def check_healthz(ledger: dict[str, object], path: Path, how: str) -> None:
    if how == "corrupt":
        assert ledger["spool"] == "disk" and ledger["spool_error"] == ""
        assert len(list(path.parent.glob("spool.sqlite.corrupt-*"))) == 1
    else:
        assert ledger["spool"] == "memory" and ledger["spool_error"]
        assert str(path.parent) not in str(ledger["spool_error"])  # /healthz is open: no paths


@pytest.mark.parametrize("how", ["corrupt", "uncreatable"])
def test_the_app_starts_serves_and_records_with_a_bad_spool(fresh_pg: str, tmp_path: Path,
                                                            how: str) -> None:
    path = bad_spool(tmp_path, how)
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False},
                               "ledger": {"url": fresh_pg, "spool_path": str(path)}})
        app = build_app(policy, analyze=False)  # the policy's own ledger: where serve failed
        with serve_app(app) as url, httpx.Client(timeout=30) as c:
            assert [c.post(url + "/v1/chat/completions", json=BODY).status_code
                    for _ in range(3)] == [200] * 3
            h = c.get(url + "/healthz")
            assert h.status_code == 200
            check_healthz(h.json()["ledger"], path, how)
            assert until(lambda: recorded(fresh_pg) == (3, 3))
        app.state.proxy.ledger.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["corrupt", "uncreatable"])
def test_prefixgate_serve_starts_with_a_bad_spool(fresh_pg: str, tmp_path: Path,
                                                  how: str) -> None:
    path = bad_spool(tmp_path, how)
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            f"backends: {{e: {{kind: openai_compat, base_url: '{up_url}/v1'}}}}\n"
            "routes: [{match: '*', backend: e}]\nrewrite: {enabled: false}\n"
            f"ledger: {{url: '{fresh_pg}', spool_path: '{path}'}}\n")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy",
                                 str(policy), "--port", str(port), "--log-level", "warning"],
                                cwd=REPO, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            def up_or_exited() -> bool:
                if proc.poll() is not None:
                    return True
                try:
                    return httpx.get(url + "/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False
            assert until(up_or_exited, 120)
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                pytest.fail(f"prefixgate serve exited {proc.returncode}: {err[-800:]}")
            assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30).status_code == 200
            check_healthz(httpx.get(url + "/healthz", timeout=10).json()["ledger"], path, how)
            assert until(lambda: recorded(fresh_pg) == (1, 1))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
