"""Differential fuzzer: seeded bodies through the whole proxy, every pass on, invariants checked.

:data:`FUZZ_BODIES` bodies per run (10,000 in CI; ``PREFIXGATE_FUZZ_BODIES`` lowers it for a
quick local look), :data:`BODIES_PER_EXAMPLE` per hypothesis example, spread over the five paths
of :data:`tests.fuzz.check.PATHS` (both APIs to their own backends, both bridges). Each body is
realistic and hostile at once (:mod:`tests.fuzz.gen_openai`, :mod:`tests.fuzz.gen_anthropic`);
each exchange is checked by :func:`tests.fuzz.check.check_exchange` (no 5xx, errors and answers
in the caller's shape, a valid upstream body, meaning kept, numbers kept, honest records).
A violation fails the test unless an entry of :data:`tests.fuzz.known_defects.KNOWN_DEFECTS`
covers it; the failure names the seed and path, which :func:`tests.fuzz.check.make_case`
turns back into the exact body.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.check import PATHS, check_exchange, make_case, path_name
from tests.fuzz.harness import FuzzRig
from tests.fuzz.known_defects import KNOWN_DEFECTS, uncovered

FUZZ_BODIES = int(os.environ.get("PREFIXGATE_FUZZ_BODIES", "10000"))
BODIES_PER_EXAMPLE = 10
SHARDS = 4
"""The bodies run as this many tests over disjoint seed ranges, so ``pytest -n`` spreads them."""
EXAMPLES = max(1, FUZZ_BODIES // BODIES_PER_EXAMPLE // SHARDS)
SEED_SPAN = 2**31 // SHARDS


@pytest.fixture(scope="module")
def rig() -> Iterator[FuzzRig]:
    logging.disable(logging.ERROR)  # thousands of known-500 tracebacks and bm25s debug lines
    try:
        with FuzzRig() as r:
            yield r
    finally:
        logging.disable(logging.NOTSET)


def run_case(rig: FuzzRig, seed: int, path: int) -> list[str]:
    """Send the body of ``(seed, path)``; return its uncovered violations as text (and count
    answers per path and violations per kind in ``rig.stats``)."""
    case = make_case(seed, path)
    before, _ = rig.ledger_state()
    ex = rig.send(case.api, case.raw, {"x-prefixgate-session": case.session, **case.headers})
    rows, status = rig.ledger_state()
    found = check_exchange(case, ex, (rows - before, status or 0))
    rig.stats[("answer", case.path, f"{ex.status // 100}xx")] += 1
    for v in found:
        rig.stats[("violation", v.kind)] += 1
    return [f"seed={seed} path={path} ({case.path}, valid={case.valid}): {v.kind}: {v.detail}"
            for v in uncovered(case.path, found, case.raw)]


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_body_keeps_meaning_validity_and_shape_through_the_proxy(rig: FuzzRig, shard: int) -> None:
    """FUZZ_BODIES / SHARDS bodies (seeds of this shard's range) over all five paths, every pass
    on: no violation outside KNOWN_DEFECTS, and the bodies reach the passes and bridges (most are
    answered 200)."""
    sent = 0
    before = dict(rig.stats)

    @settings(max_examples=EXAMPLES, phases=(Phase.explicit, Phase.generate), deadline=None)
    @given(seed=st.integers(shard * SEED_SPAN, (shard + 1) * SEED_SPAN - 1))
    def fuzz(seed: int) -> None:
        nonlocal sent
        problems: list[str] = []
        for k in range(BODIES_PER_EXAMPLE):
            problems += run_case(rig, seed * BODIES_PER_EXAMPLE + k, k)
            sent += 1
        assert not problems, "\n".join(problems[:20])

    fuzz()
    assert sent >= EXAMPLES * BODIES_PER_EXAMPLE, f"only {sent} bodies were generated"
    answers = {k[1:]: n - before.get(k, 0) for k, n in rig.stats.items() if k[0] == "answer"}
    for api, model in PATHS:
        assert answers.get((path_name(api, model), "2xx"), 0) > 0, answers
    assert sum(n for (_, cls), n in answers.items() if cls == "2xx") >= 0.6 * sent, answers


def test_known_defects_list_is_documented() -> None:
    """Every allowance names its class, summary and a reproducer body that parses as JSON."""
    ids = [d.id for d in KNOWN_DEFECTS]
    assert len(ids) == len(set(ids))
    for d in KNOWN_DEFECTS:
        assert d.summary and d.kinds and 1 <= d.issue_class <= 9
        assert isinstance(orjson.loads(d.raw), dict)  # orjson: the ~1000-deep reproducer
