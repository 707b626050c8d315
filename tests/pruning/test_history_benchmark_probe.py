"""The history benchmark's validity figures can fail (issue 14).

``bench/pruning_eval_history.py`` used to count invalid requests AFTER the pipeline's safety net
and ``prune_history``'s self-check, so the count was 0 by construction. Its probe validates the
pass's raw compaction and counts reverts; these tests plant a broken compaction and check the
probe reports it while the request sent stays valid (the defect the old figure hid).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from bench.pruning_eval_history import Probe, probed_rewrite, reverts
from prefixgate.rewriter.passes import prune_history
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Message
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import ctx
from tests.trace_requests import tau_requests

HISTORY: dict[str, Any] = {"prune_history": True, "history_high_watermark_tokens": 2000,
                           "history_low_watermark_tokens": 800}
REAL_APPLY = prune_history.apply_plan


def _replay(probe: Probe) -> list[Any]:
    """One tau-bench run through ``probed_rewrite``, memory merged like the proxy."""
    memory: dict[str, Any] = {}
    results = []
    for body in tau_requests(runs=[7])[0]:
        r = probed_rewrite(body, "openai", ctx(session=memory, **HISTORY), probe)
        memory.update(session_updates(r))
        results.append(r)
    return results


def _orphaning_apply(messages: Sequence[Message], plan: prune_history.Plan,
                     c: Context) -> list[Message]:
    """A broken compaction: also drops the tool results of the last kept call round
    (their assistant tool calls stay, so the OpenAI pairing rule breaks)."""
    out = REAL_APPLY(messages, plan, c)
    last_tool = max((i for i, m in enumerate(out) if m.role == "tool"), default=None)
    return [m for i, m in enumerate(out) if i != last_tool]


def test_probe_reports_an_invalid_raw_compaction_and_its_revert_that_the_sent_request_hides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prune_history, "apply_plan", _orphaning_apply)
    probe = Probe()
    results = _replay(probe)
    own = sum(reverts(r.edits)[0] for r in results)
    assert probe.raw_checked > 0 and probe.raw_invalid > 0
    assert set(probe.raw_violations) and own > 0
    assert all(not violations(wire.parse(r.body, "openai")) for r in results)  # what was hidden


def test_probe_checks_every_compaction_of_the_shipped_pass_and_finds_it_valid() -> None:
    probe = Probe()
    results = _replay(probe)
    applied = sum(1 for r in results for e in r.edits
                  if e.pass_name == "prune_history" and e.applied)
    assert applied > 0 and probe.raw_checked == applied
    assert probe.raw_invalid == 0 and not any(reverts(r.edits)[0] for r in results)


def test_probed_rewrite_sends_the_same_bytes_as_rewrite_request() -> None:
    memory: dict[str, Any] = {}
    for body in tau_requests(runs=[7])[0]:
        c = ctx(session=memory, **HISTORY)
        r = probed_rewrite(body, "openai", c, Probe())
        assert wire.parse(r.body, "openai") == wire.parse(rewrite_request(body, "openai", c).body,
                                                          "openai")
        memory.update(session_updates(r))


def test_reverts_counts_pipeline_reverts_and_failures_by_pass_but_not_plain_skips() -> None:
    edits = [Edit("prune_tools", False, "all", "output invalid, input kept: x:y"),
             Edit("prune_rag", False, "all", "pass failed, input kept: KeyError: 'k'"),
             Edit("prune_history", False, "messages", "compaction would be invalid, input kept: a"),
             Edit("prune_history", False, "messages", "history 10 tokens, under the watermark")]
    own, net = reverts(edits)
    assert own == 1 and net == {"prune_tools": 1, "prune_rag": 1}
