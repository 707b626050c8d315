"""500 streams at once through the proxy on loopback: no errors, one ledger row each, and the
process's memory back where it was (issue 8, "Tests").

The fault server's ``barrier`` fault holds every stream after its first event until all 500 of
the round have arrived, so the 500 are open at the same time by construction, not by luck of
timing. RSS is compared between the end of a warm-up round and the end of a second round
(allocator pools, sqlite page cache and the import of lazily loaded modules settle in the first).
"""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.faults.conftest import STALL_S
from tests.faults.fault_server import FaultServer, serve_faults
from tests.faults.outcomes import events, is_error_event
from tests.servers import serve_app

STREAMS = 500
PATH = "/v1/chat/completions"


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _round(url: str) -> list[str]:
    """STREAMS streamed requests at once; the bodies, checked."""
    limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
    async with httpx.AsyncClient(timeout=STALL_S, limits=limits) as client:
        async def one(i: int) -> str:
            body = {"model": "barrier", "stream": True, "user": f"u{i}",
                    "messages": [{"role": "user", "content": f"hi {i}"}]}
            r = await client.post(url + PATH, json=body)
            assert r.status_code == 200, r.text[:200]
            return r.text

        texts = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    for text in texts:
        evs = events(text)
        assert evs[-1] == "data: [DONE]" and not any(is_error_event(e, PATH) for e in evs)
    return list(texts)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc")
def test_500_concurrent_streams_no_errors_one_row_each_rss_steady(tmp_path: Path) -> None:
    up = FaultServer(stall_s=STALL_S, barrier_n=STREAMS)
    with serve_faults(up) as up_url:
        policy = parse_policy({
            "backends": {"oa": {"kind": "openai_compat", "base_url": up_url + "/v1",
                                "timeout_s": STALL_S}},
            "routes": [{"match": "*", "backend": "oa"}],
            "ledger": {"path": str(tmp_path / "l.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            asyncio.run(_round(url))  # warm-up
            gc.collect()
            before = rss_bytes()
            asyncio.run(_round(url))
            gc.collect()
            after = rss_bytes()
            state = app.state.proxy
            assert state.upstream.in_use == 0
    rows = ledger.rows()
    assert len(rows) == 2 * STREAMS
    assert {(r["status"], r["http_status"]) for r in rows} == {("ok", 200)}
    assert up.finished == 2 * STREAMS
    print(f"RSS before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB")
    assert after <= before * 1.10, (before, after)
