"""Every code sample in README.md and docs/ runs as written (issue 22, item 8).

Samples are the Python blocks marked ``<!-- sample: NAME -->`` (:mod:`tests.doc_samples`);
every Python block must carry a marker, and the four the issue names must exist somewhere.
Each one runs with exec, unchanged but for the proxy address (``http://127.0.0.1:8080`` ->
the test proxy's), against the **shipped policy** (its routes and aliases: ``smollm2`` is the
local engine) whose local backend is our engine on a tiny random Llama (:mod:`tests.tiny_model`).
It must finish without an exception, print something, and have every request it made recorded
by the proxy as answered (``status`` ok, HTTP 200). The modules the samples import must come
from the ``clients`` extra that the README tells a newcomer to install."""

from __future__ import annotations

import ast
import contextlib
import io
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import default_policy_text, parse_policy
from prefixgate.proxy.app import build_app
from tests.doc_samples import BASE_URL, all_samples, extract
from tests.paths import REPO
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir

SAMPLES, UNTAGGED = all_samples(REPO)
REQUIRED = {"openai-sdk", "anthropic-sdk", "langchain", "responses-api"}
"""The samples issue 22 asks for: the OpenAI SDK, the Anthropic SDK, LangChain, Responses API."""
SHIPPED_MODEL = "SmolLM2-135M-Instruct"


def test_every_python_block_in_the_docs_is_a_marked_sample() -> None:
    assert UNTAGGED == [], (
        "Python blocks without a `<!-- sample: NAME -->` line above them (tests/doc_samples.py): "
        f"{UNTAGGED}; mark each, so tests/test_doc_samples.py runs it")


def test_the_samples_the_issue_names_exist_once_each() -> None:
    names = [s.name for s in SAMPLES]
    assert REQUIRED <= set(names), f"missing samples: {sorted(REQUIRED - set(names))}"
    assert len(names) == len(set(names)), f"sample names repeat: {names}"


def test_the_extractor_reads_marked_blocks_and_reports_unmarked_ones(tmp_path: Path) -> None:
    text = ("intro\n\n<!-- sample: a -->\n\n```python\nprint(1)\n```\n\n"
            "```python\nprint(2)\n```\n\n"          # unmarked: reported
            "<!-- sample: b -->\n```bash\necho no\n```\n\n"  # not Python: not a sample
            "1. a list item\n\n   <!-- sample: c -->\n   ````py\n   x = '```'\n   print(x)\n   ````\n")
    samples, untagged = extract(tmp_path / "doc.md", text)
    assert [(s.name, s.line, s.code) for s in samples] == [
        ("a", 5, "print(1)\n"), ("c", 21, "x = '```'\nprint(x)\n")]
    assert untagged == ["doc.md:9"]


def _imported_modules(code: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def _norm(dist: str) -> str:
    return dist.lower().replace("_", "-").split("[")[0]


def test_what_the_samples_import_comes_from_the_clients_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    clients = {_norm(r.split(">")[0].split("=")[0].split("<")[0].strip()) for r in extras["clients"]}
    owners = metadata.packages_distributions()
    for s in SAMPLES:
        for mod in _imported_modules(s.code):
            dists = {_norm(d) for d in owners.get(mod, [])}
            assert dists & clients, f"{s.where} imports {mod!r} (from {dists}), not in .[clients]"
    test_extra = {_norm(r.split(">")[0].strip()) for r in extras["test"]}
    assert clients <= test_extra  # `make run` installs .[local,test]: the samples run there


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Ledger]]:
    """(proxy URL, ledger): the shipped policy, its local backend = our engine on a tiny random
    Llama served under the shipped model's id (no spawn, no model download)."""
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    eng = Engine(EngineConfig(model_path=str(tiny), num_kv_slots=8192, max_context_len=1024,
                              model_name=SHIPPED_MODEL))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            data = yaml.safe_load(default_policy_text())
            data["backends"]["local"].update(base_url=engine_url + "/v1", spawn=False)
            data["ledger"]["path"] = str(tmp_path_factory.mktemp("ledger") / "ledger.sqlite")
            policy = parse_policy(data)
            ledger = Ledger(policy.ledger.path)
            with serve_app(build_app(policy, ledger=ledger)) as url:
                yield url, ledger
    finally:
        eng.shutdown()


def _settled_rows(ledger: Ledger, after: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The ledger's rows past the first ``after``, once at least one is there and none has
    arrived for 0.3 s (a stream's row is written just after its last byte)."""
    deadline = time.monotonic() + timeout_s
    rows, since = ledger.rows(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = ledger.rows()
        if len(now) != len(rows):
            rows, since = now, time.monotonic()
        elif len(rows) > after and time.monotonic() - since >= 0.3:
            break
    return rows[after:]


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_runs_as_written(sample: Any, proxy: tuple[str, Ledger]) -> None:
    url, ledger = proxy
    assert BASE_URL in sample.code, f"{sample.where}: the sample does not use {BASE_URL}"
    code = sample.code.replace(BASE_URL, url)
    before = len(ledger.rows())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, sample.where, "exec"), {"__name__": "__main__"})  # noqa: S102
    assert out.getvalue().strip(), f"{sample.where} printed nothing"
    rows = _settled_rows(ledger, before)
    assert rows, f"{sample.where}: no request reached the proxy"
    bad = [(r["endpoint"] if "endpoint" in r else "", r["status"], r["http_status"]) for r in rows
           if r["status"] != "ok" or r["http_status"] != 200]
    assert bad == [], f"{sample.where}: requests not answered: {bad}"
