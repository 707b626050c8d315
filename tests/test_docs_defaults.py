"""Docs that state defaults agree with the code (issue 37, item 8): the passes' defaults in
``docs/passes.md`` are generated from ``RewriteSettings`` and the pipeline, every "`pass` (on /
off)" in the README and ``docs/`` says the schema's default, the shipped policy's first comment
says where models go, and the report samples in the README and ``docs/savings_report.md`` are
a real run of the command they name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from prefixgate.config.loader import default_policy, default_policy_text
from prefixgate.rewriter.defaults_doc import BEGIN, END, default_word, table
from prefixgate.rewriter.pipeline import PASSES
from tests.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MENTION = re.compile(r"`(?P<name>[a-z_]+)` \((?:`[a-z_]+`, )?(?P<word>on|off: opt-in|off|guarded)\b")
PASS_NAMES = {p.name: p.switch for p in PASSES}


def test_the_pass_defaults_block_is_generated_from_the_code() -> None:
    text = (REPO / "docs" / "passes.md").read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == table(), "docs/passes.md is stale: paste `python -m prefixgate.rewriter.defaults_doc`"


def test_every_doc_states_each_passs_default_as_the_schema_has_it() -> None:
    seen = 0
    for path in DOCS:
        for m in MENTION.finditer(path.read_text()):
            if m["name"] not in PASS_NAMES:
                continue
            seen += 1
            want = default_word(PASS_NAMES[m["name"]])
            ok = m["word"] == want or (m["word"] == "off" and want == "off: opt-in")
            assert ok, f"{path.name}: `{m['name']}` said {m['word']!r}, the schema's default is {want!r}"
    assert seen >= 2 * len(PASSES)  # the README's table and docs/passes.md's, at least


def test_the_shipped_policys_first_comment_says_where_models_go() -> None:
    first = default_policy_text().splitlines()[0]
    assert "every model" not in first
    routes = {r.match: r.backend for r in default_policy().routes}
    assert routes["gpt-*"] == "openai" and routes["claude-*"] == "anthropic" and "*" not in routes
    assert "gpt-*" in first and "claude-*" in first


def _sample(path: Path) -> str:
    text = path.read_text()
    at = text.index("python -m bench.savings_demo")
    start = text.index("```text\n", at) + len("```text\n")
    return text[start:text.index("```", start)].rstrip("\n")


@pytest.mark.slow
def test_the_report_samples_are_a_real_run(tmp_path: Path) -> None:
    ledger = tmp_path / "demo.sqlite"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "COLUMNS": "120"}
    subprocess.run([sys.executable, "-m", "bench.savings_demo", str(ledger)], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "prefixgate.proxy.cli", "report", "--ledger",
                          str(ledger)], cwd=REPO, env=env, check=True, capture_output=True,
                         text=True, timeout=120).stdout.rstrip("\n")
    assert _sample(REPO / "README.md") == out
    assert _sample(REPO / "docs" / "savings_report.md") == out
