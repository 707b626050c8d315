"""A real ``prefixgate serve`` writing to PostgreSQL, stopped two ways: SIGTERM flushes the rows
still queued in memory (none lost); SIGKILL loses exactly the rows not yet acknowledged and
nothing acknowledged, and nothing is recorded twice.

The writer's timer is set long (``flush_interval_s: 20``) so rows sent just before the signal
are still queued when it lands (``/healthz`` ``ledger.queued`` shows them); a read of
``/api/savings`` asks for a flush, which is how the first rows are acknowledged first."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.ledger_pg.pg_servers import free_port
from tests.paths import REPO
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def serve(fresh_pg: str, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            f"backends: {{e: {{kind: openai_compat, base_url: '{up_url}/v1'}}}}\n"
            "routes: [{match: '*', backend: e}]\nrewrite: {enabled: false}\n"
            f"ledger: {{url: '{fresh_pg}', replica: one, flush_interval_s: 20, "
            f"spool_path: '{tmp_path / 'spool.sqlite'}'}}\n")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy",
                                 str(policy), "--port", str(port), "--log-level", "warning"],
                                cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, "prefixgate serve exited"
                assert time.monotonic() < deadline, "prefixgate serve did not come up"
                time.sleep(0.2)
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def _send(url: str, n: int) -> None:
    with httpx.Client(timeout=30) as c:
        assert [c.post(url + "/v1/chat/completions", json=BODY).status_code
                for _ in range(n)] == [200] * n


def _recorded(db: str) -> tuple[int, int]:
    with psycopg.connect(db) as c:
        got = c.execute("SELECT count(*), count(DISTINCT row_id) FROM requests "
                        "WHERE replica = 'one'").fetchone()
    assert got is not None
    return int(got[0]), int(got[1])


@pytest.mark.slow
def test_sigterm_flushes_every_queued_row(serve: tuple[str, subprocess.Popen[bytes]],
                                          fresh_pg: str) -> None:
    url, proc = serve
    _send(url, 7)
    assert httpx.get(url + "/healthz").json()["ledger"]["queued"] == 7  # none written yet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it after shutdown
    assert _recorded(fresh_pg) == (7, 7)


@pytest.mark.slow
def test_sigkill_loses_only_the_unacknowledged_rows(serve: tuple[str, subprocess.Popen[bytes]],
                                                    fresh_pg: str) -> None:
    url, proc = serve
    _send(url, 5)
    assert httpx.get(url + "/api/savings").status_code == 200  # a read flushes: 5 acknowledged
    assert httpx.get(url + "/healthz").json()["ledger"]["queued"] == 0
    assert _recorded(fresh_pg) == (5, 5)
    _send(url, 4)
    assert httpx.get(url + "/healthz").json()["ledger"]["queued"] == 4  # not acknowledged
    proc.kill()
    proc.wait(timeout=30)
    assert _recorded(fresh_pg) == (5, 5)
