"""Made-up P/D tickets against a decode engine: how long a plain request waits behind them.

    nice .venv/bin/python bench/pd_forged_claims.py [--forged 8] [--timeout-s 30] [--out FILE]

Issue 34, item 2: each decode request carrying a ``transfer_id`` nobody sent waited
``--pd-timeout-s`` (30 s) in ``asyncio.to_thread(claim)``, on the default executor that
tokenizing also uses; 8 of them held another client's plain request ~29 s. Now a ticket whose
``transfer_tag`` does not verify is a 400 at once, and claims wait on the handoff's own bounded
threads (``server/pd_handoff.py``).

Setup: the tiny test model (2-layer Llama, ``tests/tiny_model.py``) in-process, a decode role
over the tests' loopback link (no peer ever sends), the engine's HTTP app through an ASGI
transport. ``--forged`` completions requests with made-up ``kv_transfer_params`` go first, the
plain chat request 50 ms later. Writes ``bench/results/pd_forged_claims.json``: the plain
request's status and seconds to its answer, the forged requests' statuses, the seconds until
all were answered. Run it from the repository root of the tree to measure (the figure for the
code before the fix came from the same script with ``PYTHONPATH`` at that tree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "pd_forged_claims.json"


async def measure(forged: int, timeout_s: float) -> dict[str, Any]:
    """One run (module docstring): the figures as a dict."""
    import httpx

    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.pd.roles import DecodeRole
    from prefixgate.local_engine.server import build_app
    from prefixgate.local_engine.server.pd_handoff import PDHandoff
    from prefixgate.local_engine.server.pd_setup import layout_of
    from tests.engine_pd.conftest import LoopbackLink
    from tests.tiny_model import make_tiny_model_dir

    eng = Engine(EngineConfig(model_path=str(make_tiny_model_dir(Path(tempfile.mkdtemp()))),
                              num_kv_slots=2048, max_context_len=512))
    try:
        role = DecodeRole(eng, LoopbackLink(layout_of(eng, 256)), timeout_s=timeout_s)  # type: ignore[arg-type]
        app = build_app(eng, pd=PDHandoff("decode", decode_role=role))
        body = {"model": "m", "prompt": list(range(400, 450)), "max_tokens": 4, "temperature": 0}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e",
                                     timeout=timeout_s * 4) as c:
            t0 = time.perf_counter()
            bad = [asyncio.create_task(c.post("/v1/completions", json={
                **body, "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": 1000 + i,
                                               "transfer_tag": "0" * 64}}))
                   for i in range(forged)]
            await asyncio.sleep(0.05)
            plain = await c.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            plain_s = time.perf_counter() - t0
            codes = [r.status_code for r in await asyncio.gather(*bad)]
            return {"plain_status": plain.status_code, "plain_answered_s": round(plain_s, 3),
                    "forged_statuses": codes,
                    "all_answered_s": round(time.perf_counter() - t0, 3)}
    finally:
        eng.shutdown()


def main() -> None:
    """Run once and write the result file."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forged", type=int, default=8)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    figures = asyncio.run(measure(args.forged, args.timeout_s))
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    out = {"command": "nice .venv/bin/python bench/pd_forged_claims.py " + " ".join(sys.argv[1:]),
           "commit": rev, "figures": figures}
    print(json.dumps(out, indent=2))
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
