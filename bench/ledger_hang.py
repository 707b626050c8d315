"""Rows lost across a hung PostgreSQL and a SIGTERM (issue 34, item 5), before and after the fix.

Run: ``nice -n 10 .venv/bin/python bench/ledger_hang.py [--tree PATH ...]`` (about 1 minute per
tree; writes ``bench/results/ledger_hang.json``). Each ``--tree`` is a checkout whose
``prefixgate serve`` is measured (default: this one); e.g. the code before the fix with
``git archive d22a05e prefixgate | tar -x -C /tmp/before`` and ``--tree /tmp/before --tree .``.

What runs, all on loopback, per tree:

1. A scripted upstream (a fixed chat completion), a fresh database on the machine's PostgreSQL
   (127.0.0.1:5432, dropped at the end) reached through a loopback TCP fault proxy
   (``tests/faults/tcp_fault_proxy.py``), and ``prefixgate serve`` (run from the tree) with
   ``ledger.url`` through that proxy and the policy's default writer settings.
2. ``--before`` requests answered and recorded; then the proxy hangs (connections kept open,
   nothing forwarded — what a hung server or a stuck pooler looks like); ``--during`` requests
   are sent (each answered 200); ``/healthz``'s ledger ``up`` is read at the end of them.
3. SIGTERM; if the process has not exited after ``--grace`` seconds (30, as the issue's probe),
   SIGKILL. ``exit_s``: SIGTERM to exit.
4. The database answers again; the spool the process left is drained (a later start of the
   proxy, in this process); ``lost`` = requests answered 200 with no row in PostgreSQL,
   ``duplicates`` = rows beyond one per ``row_id``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixgate.cache.ledger.pg import PgLedger  # noqa: E402
from tests.faults.tcp_fault_proxy import fault_proxy  # noqa: E402
from tests.ledger_pg.pg_servers import admin_url, create_db, drop_db, free_port  # noqa: E402
from tests.proxy.upstream import Script, ScriptedUpstream, completion  # noqa: E402
from tests.servers import serve_app  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def _count(db: str) -> tuple[int, int]:
    with psycopg.connect(db) as c:
        try:
            got = c.execute("SELECT count(*), count(DISTINCT row_id) FROM requests").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0, 0
    assert got is not None
    return int(got[0]), int(got[1])


def _until(cond: Any, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def run_tree(tree: Path, admin: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement of ``tree``'s ``prefixgate serve`` (module docstring); ``tree`` as
    given on the command line is the run's label."""
    label, tree = str(tree), tree.resolve()
    db = create_db(admin)
    port = int(db.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    tmp = Path(tempfile.mkdtemp(prefix="prefixgate-hang-"))
    spool = tmp / "spool.sqlite"
    up = ScriptedUpstream(script=Script(body=completion()))
    try:
        with fault_proxy("127.0.0.1", port) as dbp, serve_app(up.app()) as up_url:
            via = db.replace(f"127.0.0.1:{port}", f"127.0.0.1:{dbp.port}")
            policy = tmp / "policy.yaml"
            policy.write_text(
                f"backends: {{e: {{kind: openai_compat, base_url: '{up_url}/v1'}}}}\n"
                "routes: [{match: '*', backend: e}]\nrewrite: {enabled: false}\n"
                f"ledger: {{url: '{via}', spool_path: '{spool}'}}\n")
            app_port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve",
                                     "--policy", str(policy), "--port", str(app_port),
                                     "--log-level", "error"], cwd=tree)
            url = f"http://127.0.0.1:{app_port}"

            def healthy() -> bool:
                try:
                    return httpx.get(url + "/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False
            if not _until(healthy, 120):
                proc.kill()
                raise RuntimeError(f"prefixgate serve from {tree} did not come up")
            with httpx.Client(timeout=30) as c:
                ok = sum(c.post(url + "/v1/chat/completions", json=BODY).status_code == 200
                         for _ in range(args.before))
                _until(lambda: _count(db)[0] >= args.before, 30)
                dbp.set_mode("hang")
                t_hang = time.monotonic()
                ok_during = sum(c.post(url + "/v1/chat/completions", json=BODY).status_code == 200
                                for _ in range(args.during))
                time.sleep(max(0.0, args.hang_s - (time.monotonic() - t_hang)))
                ledger = c.get(url + "/healthz").json().get("ledger", {})
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=args.grace)
                killed = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                killed = True
            exit_s = time.monotonic() - t0
            dbp.set_mode("pass")
        drainer = PgLedger(db, spool_path=spool, retry_s=0.1)
        _until(lambda: drainer.state()["spooled_rows"] == 0, 60)
        drainer.close()
        rows, distinct = _count(db)
        answered = ok + ok_during
        return {"tree": label, "answered_200": answered, "answered_during_hang": ok_during,
                "healthz_ledger_up_during_hang": ledger.get("up"),
                "healthz_queued_during_hang": ledger.get("queued"),
                "sigterm_exit_s": round(exit_s, 2), "sigkilled_after_grace": killed,
                "rows_recorded": distinct, "lost": answered - distinct,
                "duplicates": rows - distinct}
    finally:
        drop_db(admin, db)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", type=Path, help="checkout to run serve from")
    ap.add_argument("--before", type=int, default=5, help="requests before the hang")
    ap.add_argument("--during", type=int, default=30, help="requests during the hang")
    ap.add_argument("--hang-s", type=float, default=3.0, help="hang at least this long before SIGTERM")
    ap.add_argument("--grace", type=float, default=30.0, help="SIGTERM to SIGKILL, seconds")
    ap.add_argument("--note", default="", help="free text kept in the result (e.g. what a tree is)")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/ledger_hang.json")
    args = ap.parse_args()
    admin = admin_url()
    if admin is None:
        sys.exit("no PostgreSQL on 127.0.0.1:5432 / :55432 (run `make postgres`)")
    trees = args.tree or [Path(".")]
    runs = [run_tree(t, admin, args) for t in trees]
    doc = {"what": "rows lost across a hung PostgreSQL + SIGTERM (issue 34, item 5)",
           "command": " ".join(["nice -n 10 .venv/bin/python bench/ledger_hang.py",
                                *[f"--tree {t}" for t in trees]]),
           "settings": {"before": args.before, "during": args.during, "hang_s": args.hang_s,
                        "grace_s": args.grace, "policy": "ledger defaults (flush_interval_s "
                        "0.02, write_timeout_s 5 where it exists)"},
           "note": args.note, "runs": runs}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
