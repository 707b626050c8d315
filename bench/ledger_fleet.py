"""Three prefixgate replicas, one PostgreSQL ledger, faults on purpose (issue 26).

Run: ``nice -n 10 .venv/bin/python bench/ledger_fleet.py`` (about 1-2 minutes; writes
``bench/results/ledger_fleet.json``). Needs Debian's PostgreSQL binaries (``make postgres``):
the database is a throwaway cluster of this script's own (``initdb`` / ``pg_ctl`` on a free
loopback port, removed at the end), so restarting it touches nobody else's server.

What runs, all on loopback:

1. A scripted upstream (a fixed chat completion) and four ``prefixgate serve`` processes
   against it: replicas ``r1``, ``r2``, ``r3`` with ``ledger.url`` on the cluster (one shared
   spool file, as replicas on one host have by default), and ``lite`` with the SQLite ledger.
2. Latency, calm: ``--calm`` sequential requests alternating between ``r3`` and ``lite``;
   ``added_p50_ms_vs_sqlite`` = client-side p50 through ``r3`` minus through ``lite``. The
   ledger's own part of the request path (the ``write()`` call, which only queues) is measured
   in-process too: ``write_call_p50_us`` per ledger kind.
3. Faults, under load (``--concurrency`` clients, round-robin over the replicas still up,
   each request with its own session id, for ``--seconds``): at 30 % ``r1`` is SIGKILLed, at
   50 % PostgreSQL is restarted (``pg_ctl restart -m fast``: connections cut, rows spool), at
   70 % ``r2`` is SIGTERMed; at the end ``r3`` is SIGTERMed once its spool is empty.
4. The count: each answered request's session hash looked up in the ledger. ``rows_sent``:
   requests answered 200; ``rows_recorded``: ledger rows of this run's sessions;
   ``duplicates``: rows beyond one per session; ``lost_on_kill`` / ``lost_on_term`` /
   ``lost_other``: answered requests of ``r1`` / ``r2`` / ``r3`` with no row.
5. ``write_p99_ms``: p99 of write-to-acknowledgement (committed, or spooled) over rows written
   in-process by a :class:`~prefixgate.cache.ledger.pg.PgLedger` at ``--rate`` rows/s, the
   replicas' writer settings.

Goals (issue 26): 0 duplicates; rows lost only from the SIGKILLed replica's unacknowledged batch
(SIGTERM loses 0); the added p50 within 0.2 ms of SQLite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.cache.ledger.pg import PgLedger  # noqa: E402
from prefixgate.cache.ledger.store import LedgerRow  # noqa: E402
from prefixgate.cache.ledger.writer import BatchedLedger  # noqa: E402
from prefixgate.cache.savings.report import percentile  # noqa: E402
from prefixgate.proxy.pipeline.session_key import SESSION_HEADER, session_hash  # noqa: E402
from tests.ledger_pg.pg_servers import PrivateCluster, create_db, free_port  # noqa: E402
from tests.proxy.upstream import Script, ScriptedUpstream, completion  # noqa: E402
from tests.servers import serve_app  # noqa: E402

OUT = REPO / "bench" / "results" / "ledger_fleet.json"
BODY = {"model": "m", "messages": [{"role": "user", "content": "ping"}]}
FLUSH_S = 0.02


def _policy(path: Path, up_url: str, ledger: str) -> Path:
    path.write_text(f"backends: {{e: {{kind: openai_compat, base_url: '{up_url}/v1'}}}}\n"
                    "routes: [{match: '*', backend: e}]\nrewrite: {enabled: false}\n"
                    f"ledger: {ledger}\n")
    return path


def _start(policy: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy",
                             str(policy), "--port", str(port), "--log-level", "error"], cwd=REPO)
    return f"http://127.0.0.1:{port}", proc


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"replica at {url} did not come up")
        time.sleep(0.2)


def _ask(client: httpx.Client, url: str, sid: str) -> float | None:
    """One request; its client-side latency in ms, None when it was not answered 200."""
    t0 = time.perf_counter()
    try:
        r = client.post(url + "/v1/chat/completions", json=BODY, headers={SESSION_HEADER: sid})
    except httpx.HTTPError:
        return None
    return (time.perf_counter() - t0) * 1000.0 if r.status_code == 200 else None


def calm_latency(pg_url: str, lite_url: str, n: int) -> dict[str, Any]:
    """Client-side p50 through a PostgreSQL replica and a SQLite one, requests alternating."""
    lat: dict[str, list[float]] = {"pg": [], "lite": []}
    with httpx.Client(timeout=30) as c:
        for i in range(n):
            for name, url in (("pg", pg_url), ("lite", lite_url)) if i % 2 else (
                    ("lite", lite_url), ("pg", pg_url)):
                ms = _ask(c, url, f"calm-{uuid.uuid4().hex}")
                if ms is not None:
                    lat[name].append(ms)
    p_pg, p_lite = percentile(lat["pg"], 50), percentile(lat["lite"], 50)
    assert p_pg is not None and p_lite is not None
    return {"p50_ms_postgres": round(p_pg, 3), "p50_ms_sqlite": round(p_lite, 3),
            "added_p50_ms_vs_sqlite": round(p_pg - p_lite, 3), "requests_each": n}


def write_call_us(db_url: str, tmp: Path, n: int = 20_000) -> dict[str, float]:
    """p50 of one ``write()`` call (µs): what the ledger adds on the request path."""
    out: dict[str, float] = {}
    for name, led in (("postgresql", PgLedger(db_url, spool_path=tmp / "wc-spool.sqlite",
                                              replica="wc", flush_interval_s=FLUSH_S)),
                      ("sqlite", BatchedLedger(tmp / "wc.sqlite", replica="wc"))):
        rows = [LedgerRow(model="m", prompt_tokens=100) for _ in range(n)]
        times = []
        for r in rows:
            t0 = time.perf_counter_ns()
            led.write(r)
            times.append((time.perf_counter_ns() - t0) / 1000.0)
        led.close()
        p = percentile(times, 50)
        out[name] = round(p or 0.0, 2)
    return out


def write_ack_p99(db_url: str, tmp: Path, rate: float, seconds: float) -> float:
    """p99 write-to-acknowledgement (ms) of a PgLedger written at ``rate`` rows/s."""
    led = PgLedger(db_url, spool_path=tmp / "ack-spool.sqlite", replica="ack",
                   flush_interval_s=FLUSH_S)
    led.write(LedgerRow(model="warm"))
    led.flush()
    led.ack_ms.clear()
    gap = 1.0 / rate
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        led.write(LedgerRow(model="m", prompt_tokens=100))
        time.sleep(gap)
    led.flush()
    p = percentile(list(led.ack_ms), 99)
    led.close()
    return round(p or 0.0, 3)


class Load:
    """``concurrency`` client threads sending to the replicas in ``live`` round-robin; each
    answered request's session id is kept under its replica's name."""

    def __init__(self, urls: dict[str, str], concurrency: int) -> None:
        self.live = dict(urls)
        self.sent: dict[str, list[str]] = {n: [] for n in urls}
        self.answered: dict[str, list[str]] = {n: [] for n in urls}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(concurrency)]

    def _client(self, i: int) -> None:
        k = i
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                with self.lock:
                    names = sorted(self.live)
                if not names:
                    return
                name = names[k % len(names)]
                k += 1
                sid = f"fleet-{uuid.uuid4().hex}"
                with self.lock:
                    self.sent[name].append(sid)
                if _ask(c, self.live.get(name, ""), sid) is not None:
                    with self.lock:
                        self.answered[name].append(sid)

    def drop(self, name: str) -> None:
        """Stop sending to ``name`` (before it is signalled)."""
        with self.lock:
            self.live.pop(name, None)


def _spool_empty(url: str) -> bool:
    try:
        led = httpx.get(url + "/healthz", timeout=2).json().get("ledger", {})
    except httpx.HTTPError:
        return False
    return led.get("spooled_rows") == 0 and led.get("queued") == 0 and bool(led.get("up"))


def faults(cluster: PrivateCluster, procs: dict[str, subprocess.Popen[bytes]],
           urls: dict[str, str], seconds: float, concurrency: int) -> tuple[Load, list[str]]:
    """The fault run (module docstring, 3); returns the load and the event log."""
    load = Load(urls, concurrency)
    events: list[str] = []
    t0 = time.monotonic()

    def at(frac: float) -> None:
        time.sleep(max(0.0, t0 + frac * seconds - time.monotonic()))

    for t in load.threads:
        t.start()
    at(0.3)
    try:  # what r1 holds unacknowledged a moment before the kill (its writer's queue)
        queued = httpx.get(urls["r1"] + "/healthz", timeout=2).json()["ledger"]["queued"]
    except (httpx.HTTPError, KeyError):
        queued = None
    load.drop("r1")
    procs["r1"].send_signal(signal.SIGKILL)
    events.append(f"{time.monotonic() - t0:.1f}s SIGKILL r1 (queued just before: {queued})")
    at(0.5)
    events.append(f"{time.monotonic() - t0:.1f}s postgres stop")
    cluster.stop()
    time.sleep(1.0)
    cluster.start()
    events.append(f"{time.monotonic() - t0:.1f}s postgres started again")
    at(0.7)
    load.drop("r2")
    procs["r2"].send_signal(signal.SIGTERM)
    events.append(f"{time.monotonic() - t0:.1f}s SIGTERM r2")
    at(1.0)
    load.stop.set()
    for t in load.threads:
        t.join()
    deadline = time.monotonic() + 60
    while not _spool_empty(urls["r3"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    events.append(f"{time.monotonic() - t0:.1f}s r3 spool empty: {_spool_empty(urls['r3'])}")
    procs["r3"].send_signal(signal.SIGTERM)
    for name in ("r1", "r2", "r3"):
        procs[name].wait(timeout=60)
    events.append(f"{time.monotonic() - t0:.1f}s all replicas stopped")
    return load, events


def count(db_url: str, load: Load) -> dict[str, Any]:
    """The figures of module docstring, 4, from the ledger's rows."""
    with psycopg.connect(db_url) as c:
        got = c.execute("SELECT session, replica FROM requests").fetchall()
    per: dict[str, int] = {}
    for s, _ in got:
        per[s] = per.get(s, 0) + 1
    mine = {session_hash(sid) for sids in load.sent.values() for sid in sids}
    recorded = sum(n for s, n in per.items() if s in mine)
    dups = sum(n - 1 for s, n in per.items() if s in mine and n > 1)

    def lost(name: str) -> int:
        return sum(1 for sid in load.answered[name] if session_hash(sid) not in per)

    by_replica: dict[str, int] = {}
    for s, rep in got:
        if s in mine:
            by_replica[rep] = by_replica.get(rep, 0) + 1
    return {"rows_sent": sum(len(v) for v in load.answered.values()),
            "rows_recorded": recorded, "duplicates": dups,
            "lost_on_kill": lost("r1"), "lost_on_term": lost("r2"), "lost_other": lost("r3"),
            "answered_by_replica": {n: len(v) for n, v in load.answered.items()},
            "recorded_by_replica": by_replica}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--calm", type=int, default=300, help="requests per replica, calm phase")
    ap.add_argument("--rate", type=float, default=300.0, help="rows/s for write_p99_ms")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="prefixgate-fleet-"))
    os.chmod(tmp, 0o755)
    cluster = PrivateCluster(tmp / "pg", free_port())
    cluster.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        db = create_db(cluster.url)
        up = ScriptedUpstream(script=Script(body=completion()))
        with serve_app(up.app()) as up_url:
            urls: dict[str, str] = {}
            for name in ("r1", "r2", "r3"):
                led = (f"{{url: '{db}', replica: {name}, flush_interval_s: {FLUSH_S}, "
                       f"spool_path: '{tmp / 'spool.sqlite'}'}}")
                urls[name], procs[name] = _start(_policy(tmp / f"{name}.yaml", up_url, led))
            urls["lite"], procs["lite"] = _start(_policy(
                tmp / "lite.yaml", up_url, f"{{path: '{tmp / 'lite.sqlite'}', replica: lite}}"))
            with httpx.Client(timeout=60) as c:
                for name in urls:  # up, and warm: a cold process's first requests load tokenizers
                    _wait_up(urls[name], procs[name])
                    for _ in range(10):
                        _ask(c, urls[name], "warm")
            calm = calm_latency(urls["r3"], urls["lite"], args.calm)
            fleet = {n: urls[n] for n in ("r1", "r2", "r3")}
            load, events = faults(cluster, procs, fleet, args.seconds, args.concurrency)
            procs["lite"].send_signal(signal.SIGTERM)
            procs["lite"].wait(timeout=60)
        figures = {"replicas": 3, **count(db, load)}
        figures["write_p99_ms"] = write_ack_p99(db, tmp, args.rate, 10.0)
        figures["added_p50_ms_vs_sqlite"] = calm["added_p50_ms_vs_sqlite"]
        detail = {"calm": calm, "write_call_p50_us": write_call_us(db, tmp), "events": events,
                  "seconds": args.seconds, "concurrency": args.concurrency,
                  "flush_interval_s": FLUSH_S, "machine": f"{os.cpu_count()} cores, shared"}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        try:
            cluster.stop()
        except Exception:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"command": command(__file__, prefix="nice -n 10 .venv/bin/python"), "figures": figures,
           "detail": detail}
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
