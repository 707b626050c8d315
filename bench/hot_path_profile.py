"""Where a proxied request's CPU goes: py-spy samples of ``prefixgate serve`` under ``wrk`` (issue 25).

    python bench/hot_path_profile.py [--seconds 8] [--top 15] [--out bench/results/hot_path_profile.json]

Used by ``bench/proxy_overhead.py`` (its ``"profile_top"``) and runnable alone. For each case
— ``small_off`` (1 KB body, rewrite off), ``agent_off`` / ``agent_on`` (the 29 KB tau-bench
agent body, rewrite off / on) — one ``prefixgate serve`` worker in front of the fake upstream is
sampled by ``py-spy record --rate 250 --format raw --gil`` (only the thread holding the GIL:
the process's CPU in Python, not threads waiting for the GIL inside a C call — on 2 busy cores
those waits otherwise fill a third of the samples) while ``wrk -t1 -c8`` POSTs the body. The raw stacks are folded into:

- ``self``: the functions most often on top of a stack (share of the busy samples, %);
- ``inclusive``: the functions most often anywhere in a stack (%; a frame counted once per
  sample however deep it recurses) — the hot path's layers: parse, passes, render, record.

Needs ``py-spy`` (``pip install py-spy``; the ``bench`` extra) and ptrace rights over a child
process (the default for a process's own children).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench.proxy_targets as po  # noqa: E402
from bench.result_file import command, write_json  # noqa: E402

RATE_HZ = 250
FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_name(frame: str) -> str:
    """``"fn (path/to/module.py:12)"`` -> ``"fn module.py"`` (line dropped: a function, not a
    line, is the unit a reader acts on; the path shortened to ``package/module.py``)."""
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    parts = Path(m.group("file")).parts
    return f"{m.group('fn')} {'/'.join(parts[-2:])}"


LAYERS = ("prefixgate/", "starlette/", "fastapi/", "aiohttp/", "uvicorn/protocols/", "orjson",
          "pydantic", "json/", "sqlite3/")
"""Whose frames the inclusive view keeps: ours and the layers a request crosses (the process's
own bootstrap — runpy, typer, the server loop, thread starts — is in every sample and says
nothing)."""


def fold(lines: Iterable[str]) -> tuple[Counter[str], Counter[str], int]:
    """Fold py-spy raw lines (``frame;frame;...;leaf COUNT``) into self counts, inclusive
    counts (frames of :data:`LAYERS` only) and the total sample count. A malformed line is
    skipped."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        self_c[frame_name(frames[-1])] += n
        for name in {frame_name(f) for f in frames if any(x in f for x in LAYERS)}:
            incl[name] += n
    return self_c, incl, total


def top(counts: Counter[str], total: int, k: int) -> list[dict[str, Any]]:
    """The ``k`` largest entries as ``{"fn", "pct"}`` (share of ``total`` samples, %)."""
    return [{"fn": fn, "pct": round(100.0 * n / total, 1)} for fn, n in counts.most_common(k)]


def summary(raw: str, k: int) -> dict[str, Any]:
    """The profile's top ``k`` self and inclusive entries (module docstring)."""
    self_c, incl, total = fold(raw.splitlines())
    if total == 0:
        return {"samples": 0, "self": [], "inclusive": []}
    return {"samples": total, "self": top(self_c, total, k), "inclusive": top(incl, total, k)}


def profile_case(url: str, pid: int, body: bytes, seconds: int, tmp: Path, k: int,
                 wrk_fn: Any) -> dict[str, Any]:
    """Sample process ``pid`` for ``seconds`` while ``wrk_fn`` loads ``url`` with ``body``."""
    out = tmp / f"spy-{pid}-{len(body)}.txt"
    spy = subprocess.Popen([py_spy(), "record", "--pid", str(pid), "--rate", str(RATE_HZ),
                            "--duration", str(seconds), "--format", "raw", "--nonblocking",
                            "--gil", "--output", str(out)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    rps = wrk_fn(url, body, seconds, tmp, connections=8)
    spy.wait(seconds + 30)
    raw = out.read_text() if out.exists() else ""
    return {**summary(raw, k), "rps_while_sampled": round(rps, 1)}


def py_spy() -> str:
    """The py-spy executable next to this interpreter, else on PATH (RuntimeError if none)."""
    here = Path(sys.executable).with_name("py-spy")
    exe = str(here) if here.exists() else shutil.which("py-spy")
    if not exe:
        raise RuntimeError("py-spy is not installed: pip install py-spy (the bench extra)")
    return exe


def profile_all(seconds: int, k: int, tmp: Path) -> dict[str, Any]:
    """The three cases (module docstring), each in its own fresh server."""
    small, agent = po.wire(po.SMALL), po.wire(po.agent_body())
    procs = []
    try:
        up_proc, up = po.start_upstream()
        procs.append(up_proc)
        out: dict[str, Any] = {"command": "python bench/hot_path_profile.py", "gil_only": True,
                               "rate_hz": RATE_HZ,
                               "seconds": seconds, "load": "wrk -t1 -c8"}
        for name, body, rewrite in (("small_off", small, False), ("agent_off", agent, False),
                                    ("agent_on", agent, True)):
            proc, url = po.start_prefixgate(up, tmp, f"prof-{name}", rewrite)
            procs.append(proc)
            po.wrk(url, body, 2, tmp)  # warm: imports, token counters, session memory
            out[name] = profile_case(url, proc.pid, body, seconds, tmp, k, po.wrk)
            proc.terminate()
            proc.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
    return out


def main() -> None:
    """Profile and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "hot_path_profile.json"))
    args = ap.parse_args()
    doc = profile_all(args.seconds, args.top, Path(tempfile.mkdtemp(prefix="pg-profile-")))
    doc["command"] = command(__file__, prefix="nice -n 5 python")
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
