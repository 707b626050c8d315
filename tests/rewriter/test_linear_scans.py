"""Every text scan in ``rewriter/`` and ``cache/`` is linear in its input (issue 8, class 2).

Regexes are checked by construction on their parsed form: every quantifier is bounded, so one
match attempt examines at most ``MAX_REACH`` characters and a scan costs at most that much per
start position. Python-level scanners are checked by counting the interpreter's line events
(deterministic operation counts, no clocks) on adversarial inputs of growing size.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from re import _parser as sre  # type: ignore[attr-defined]
from typing import Any

import pytest

from prefixgate.cache.savings import break_spans as cache_spans
from prefixgate.rewriter.analysis import passages
from prefixgate.rewriter.analysis import volatile_spans as spans

REPO = Path(__file__).resolve().parents[2]
MAX_REACH = spans.MAX_REACH
LINEAR_BY_ARGUMENT = {
    # one greedy run of a single character class per alternative, lookahead of 2 characters,
    # and finditer resumes after the run: each character is examined a bounded number of times
    "prefixgate.rewriter.analysis.bm25._WORD",
    # a word then one greedy run of one character class, no alternation: finditer resumes
    # after the run, so each character is examined a bounded number of times
    "prefixgate.rewriter.passes.prune_tools._WORD",
}


def _reach(parsed: Any) -> float:
    """Upper bound on the characters one match attempt may examine (lookarounds included)."""
    total = 0.0
    for op, av in parsed:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN", "CATEGORY", "RANGE"):
            total += 1
        elif name == "AT":
            total += 1  # \b looks at one neighbour
        elif name == "SUBPATTERN":
            total += _reach(av[-1])
        elif name == "ATOMIC_GROUP":
            total += _reach(av)
        elif name == "BRANCH":
            total += max(_reach(b) for b in av[1])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, body = av
            total += float("inf") if hi == sre.MAXREPEAT else hi * _reach(body)
        elif name in ("ASSERT", "ASSERT_NOT"):
            total += _reach(av[1])
        else:  # GROUPREF and anything unknown: no bound
            total += float("inf")
    return total


def _patterns() -> Iterator[tuple[str, re.Pattern[str]]]:
    for pkg in ("prefixgate.rewriter", "prefixgate.cache"):
        root = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(root.__path__, pkg + "."):
            mod = importlib.import_module(info.name)
            for key, v in vars(mod).items():
                items = v.values() if isinstance(v, dict) else v if isinstance(v, tuple) else [v]
                for x in items:
                    for p in (x if isinstance(x, tuple) else (x,)):
                        if isinstance(p, re.Pattern):
                            yield f"{info.name}.{key}", p


def test_every_regex_in_rewriter_and_cache_has_a_bounded_reach() -> None:
    checked = 0
    for name, p in _patterns():
        if name in LINEAR_BY_ARGUMENT:
            continue
        checked += 1
        assert _reach(sre.parse(p.pattern, p.flags)) <= MAX_REACH, (name, p.pattern)
    assert checked >= 20  # the detectors, passages' tags, learned words


def test_the_old_labelled_id_pattern_is_caught_by_the_reach_check() -> None:
    old = (r"(?i:\b(?:request|req)[ _-]?(?:id)?\b)\W{1,3}(?P<v>(?=[A-Za-z0-9_-]*\d)"
           r"[A-Za-z0-9_-]{16,})")
    assert _reach(sre.parse(old)) == float("inf")


def test_regexes_are_compiled_at_module_level_where_the_reach_check_sees_them() -> None:
    calls = ("compile", "search", "match", "fullmatch", "finditer", "findall", "sub", "split")
    for folder in ("rewriter", "cache"):
        for path in (REPO / "prefixgate" / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                            and node.func.attr in calls):
                        pytest.fail(f"{path.name}:{node.lineno} builds a regex inside a function")


def _line_events(fn: Callable[[], Any]) -> int:
    """Python line events executed by ``fn()`` (all frames): a deterministic work count."""
    n = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal n
        if event == "line":
            n += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n


def assert_linear(make: Callable[[int], Any], run: Callable[[Any], Any], n: int = 2000) -> None:
    """Work on a 4x larger input is at most ~4x (plus a constant): no quadratic term."""
    small, big = make(n), make(4 * n)
    w1, w4 = _line_events(lambda: run(small)), _line_events(lambda: run(big))
    assert w4 <= 4.4 * w1 + 200, (w1, w4)


ADVERSARIAL_TEXTS: dict[str, Callable[[int], str]] = {
    "label runs": lambda n: "request-" * n,
    "labels then a long id": lambda n: "session id: " + "a-" * (4 * n),
    "digit runs": lambda n: "1" * (8 * n),
    "month names": lambda n: "Mar " * n,
    "unclosed tags": lambda n: "<document>" * n + "</document></document>",
    "many uuids on one line": lambda n: "x 123e4567-e89b-12d3-a456-426614174000" * n,
    "many clocks": lambda n: "time 10:15 " * n,
    "numbered markers": lambda n: "".join(f"[{i % 9999}] p\n" for i in range(n)),
}


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL_TEXTS))
@pytest.mark.parametrize("scan", ["rewriter.find_spans", "cache.find_spans", "find_passages"])
def test_each_scanner_does_linear_work_on_adversarial_text(shape: str, scan: str) -> None:
    fn = {"rewriter.find_spans": spans.find_spans, "cache.find_spans": cache_spans.find_spans,
          "find_passages": passages.find_passages}[scan]
    assert_linear(ADVERSARIAL_TEXTS[shape], fn)
