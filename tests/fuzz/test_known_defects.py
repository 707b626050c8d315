"""Each KNOWN_DEFECTS allowance still reproduces: when one stops, its fix has landed — delete the
entry (tests/fuzz/known_defects.py) so the differential fuzzer holds that class strictly."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.fuzz.check import Case, check_exchange
from tests.fuzz.harness import FuzzRig
from tests.fuzz.jsontext import loads
from tests.fuzz.known_defects import KNOWN_DEFECTS, KnownDefect
from tests.fuzz.meaning import Violation


@pytest.fixture(scope="module")
def rig() -> Iterator[FuzzRig]:
    logging.disable(logging.ERROR)  # the known 500s log tracebacks
    try:
        with FuzzRig() as r:
            yield r
    finally:
        logging.disable(logging.NOTSET)


def reproduce(rig: FuzzRig, d: KnownDefect) -> tuple[Case, list[Violation]]:
    """Send ``d``'s reproducer in a session of its own; return the case and its violations."""
    raw = d.raw.encode()
    try:
        body = loads(raw)
    except RecursionError:  # deeper than this checker parses: status checks only
        body = {}
    case = Case(d.api, d.model, body, raw, valid=False, session="repro-" + d.id)
    before, _ = rig.ledger_state()
    ex = rig.send(case.api, raw, {"x-prefixgate-session": case.session, **dict(d.headers)})
    rows, status = rig.ledger_state()
    return case, check_exchange(case, ex, (rows - before, status or 0))


@pytest.mark.parametrize("defect", KNOWN_DEFECTS, ids=lambda d: d.id)
def test_known_defect_still_reproduces(rig: FuzzRig, defect: KnownDefect) -> None:
    case, found = reproduce(rig, defect)
    assert any(defect.covers(case.path, v, case.raw) for v in found), (
        f"{defect.id} no longer reproduces (violations now: {[v.kind for v in found]}): its fix "
        "has landed, remove the entry from KNOWN_DEFECTS in tests/fuzz/known_defects.py")
