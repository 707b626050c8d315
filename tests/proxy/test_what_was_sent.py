"""What was sent (issue 9, item 7): ``prefixgate rewrite``, the opt-in
``x-prefixgate-edit-detail`` header, and the README's "what the model now sees" column."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
from typer.testing import CliRunner

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.cli.rewrite import WHAT_THE_MODEL_SEES
from prefixgate.proxy.pipeline.edit_detail import HEADER, MAX_HEADER_BYTES, blocks_of, bounded_json
from prefixgate.rewriter.pipeline import PASSES, rewrite_request
from prefixgate.rewriter.types import Context
from tests.proxy.upstream import Script, completion

ROOT = Path(__file__).resolve().parents[2]
CLOCK = "2026-12-01T10:54:06Z"


def request_body() -> dict[str, Any]:
    """Tools out of name order (canonicalize_tools) and a request id in the system prompt
    (hoist_volatile moves it on a session's first request; the clock stays until it is seen
    changing)."""
    tools = [{"type": "function", "function": {
        "name": n, "description": f"Tool {n} looks records up and returns what it found.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                       "required": ["id"]}}} for n in ("zeta_lookup", "alpha_search", "mid_update")]
    return {"model": "gpt-4o", "temperature": 0.20, "tools": tools, "messages": [
        {"role": "system", "content": "Request ID: req_4c1f9e27ab03d58e61\n"
                                      "You are an airline agent. Verify the user's identity "
                                      "before any change to a booking, and follow the fare "
                                      f"rules exactly.\nCurrent time: {CLOCK}\nAnswer briefly "
                                      "and cite the booking reference when you have one."},
        {"role": "user", "content": "Change my flight to tomorrow, booking ABC123."}]}


MOVES = {"hoist_volatile": True, "stabilise_passages": True, "tool_order": "name"}
"""The passes this file explains, switched on: hoisting and passage stabilising are opt-in
(``MOVES_THE_MODEL_READS``), and the default ``tool_order: "first_seen"`` leaves a session's
first tools as sent; ``"name"`` sorts them, so every pass has something to show."""


def moves_policy(tmp_path: Path) -> Path:
    """A policy file with :data:`MOVES` on (the shipped one has them off)."""
    pol = tmp_path / "moves.yaml"
    pol.write_text("backends: {up: {kind: openai_compat, base_url: 'http://127.0.0.1:9/v1'}}\n"
                   "routes: [{match: '*', backend: up}]\n"
                   "rewrite: {hoist_volatile: true, stabilise_passages: true, tool_order: name}\n")
    return pol


def tool_tokens(body: dict[str, Any]) -> int:
    return sum(b.tokens for b in blocks_of(body, "openai") if b.region == "tools")


def run_cli(tmp_path: Path, *args: str, body: Any = None) -> Any:
    f = tmp_path / "req.json"
    text = json.dumps(request_body() if body is None else body)
    f.write_text(text.replace('"temperature": 0.2,', '"temperature": 0.20,'))  # as typed
    return CliRunner().invoke(cli, ["rewrite", str(f), *args])


def test_rewrite_json_is_the_pipelines_body_with_a_diff_and_explained_edits(tmp_path: Path) -> None:
    res = run_cli(tmp_path, "--provider", "radix", "--json", "--policy", str(moves_policy(tmp_path)))
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    body = request_body()
    expected = rewrite_request(body, "openai", Context(settings=RewriteSettings(**MOVES), model="gpt-4o",
                                                       provider="radix", session_id="cli"))
    assert out["body"] == json.loads(orjson.dumps(expected.body))
    assert [t["function"]["name"] for t in out["body"]["tools"]] == [
        "alpha_search", "mid_update", "zeta_lookup"]
    assert out["summary"] == expected.summary() == "canonicalize_tools;hoist_volatile"
    assert '-        "name": "zeta_lookup",' in out["diff"]
    assert "Request ID: req_4c1f9e27ab03d58e61" in out["diff"]  # moved, shown line by line
    assert "Request ID: req_4c1f9e27ab03d58e61" in json.dumps(out["body"]["messages"][-1])
    assert out["diff"].startswith("--- original\n+++ rewritten\n")
    by_pass = {e["pass"]: e for e in out["edits"]}
    assert list(by_pass) == ["canonicalize_tools", "hoist_volatile", "stabilise_passages",
                            "place_breakpoints"]
    assert by_pass["canonicalize_tools"]["applied"] is True
    assert by_pass["canonicalize_tools"]["first_change_token"] == 0  # the first tool moved
    hoist = by_pass["hoist_volatile"]
    assert hoist["region"] == "system"
    # the system text changed: everything before it (the tools, now sorted) is left as it was
    assert hoist["first_change_token"] == tool_tokens(expected.body) > 0
    assert hoist["model_sees"] == WHAT_THE_MODEL_SEES["hoist_volatile"]
    skipped = by_pass["place_breakpoints"]
    assert skipped["applied"] is False and skipped["first_change_token"] is None
    assert "radix" in skipped["detail"] and skipped["model_sees"] == "no change"


def test_rewrite_text_output_and_numbers_kept(tmp_path: Path) -> None:
    res = run_cli(tmp_path, "--provider", "radix", "--policy", str(moves_policy(tmp_path)))
    assert res.exit_code == 0, res.output
    text = res.output
    assert text.index("== rewritten body ==") < text.index("== diff") < text.index("== edits")
    assert '"temperature": 0.20' in text  # the client's number text, not 0.2
    assert re.search(r"1\. canonicalize_tools \[applied\] tools: [\d,]+ -> [\d,]+ tokens, "
                     r"first change at token 0", text)
    assert "the model now sees: a system prompt with" in text
    assert "4. place_breakpoints [skipped]" in text


def test_rewrite_with_rewriting_off_shows_no_change(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("backends: {up: {kind: openai_compat, base_url: 'http://127.0.0.1:9/v1'}}\n"
                   "routes: [{match: '*', backend: up}]\nrewrite: {enabled: false}\n")
    res = run_cli(tmp_path, "--policy", str(pol), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["body"] == request_body() and out["diff"] == "" and out["edits"] == []
    assert out["provider"] == "radix"  # openai_compat follows radix rules


def test_rewrite_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    assert run_cli(tmp_path, body=[1, 2]).exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(cli, ["rewrite", str(bad)])
    assert res.exit_code == 2
    assert f"{bad}: not valid JSON: " in res.output  # about the file, not "your request"
    assert f"{tmp_path / 'req.json'}: not a request body" in run_cli(tmp_path, body=[1]).output
    missing = CliRunner().invoke(cli, ["rewrite", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2
    assert "nope.json: cannot read: No such file or directory" in missing.output
    assert run_cli(tmp_path, "--provider", "bogus").exit_code == 2


def test_edit_detail_header_opt_in(rig_factory: Any) -> None:
    off = rig_factory(rewrite_fn=rewrite_request, rewrite=MOVES)
    off.upstream.script = Script(body=completion())
    r = httpx.post(off.url + "/v1/chat/completions", json=request_body())
    assert r.status_code == 200 and HEADER not in r.headers  # off by default

    on = rig_factory(rewrite_fn=rewrite_request, rewrite={**MOVES, "edit_detail_header": True})
    r = httpx.post(on.url + "/v1/chat/completions", json=request_body())
    assert r.status_code == 200
    detail = json.loads(r.headers[HEADER])
    sent = on.upstream.seen[-1].json
    assert detail["first_diff"] == 0 and detail["more"] == 0
    edits = {e["pass"]: e for e in detail["edits"]}
    assert edits["canonicalize_tools"] == {"pass": "canonicalize_tools", "applied": True,
                                           "region": "tools", "at": 0,
                                           "before": edits["canonicalize_tools"]["before"],
                                           "after": edits["canonicalize_tools"]["after"]}
    assert edits["hoist_volatile"]["at"] == tool_tokens(sent)  # the system starts after tools
    assert CLOCK not in r.headers[HEADER]  # no prompt text


def test_edit_detail_is_bounded_and_keeps_applied_edits_first() -> None:
    items = [{"pass": f"p{i}", "applied": i % 2 == 0, "region": "messages", "at": i,
              "before": 10, "after": 5} for i in range(200)]
    value = bounded_json(3, items)
    assert len(value) <= MAX_HEADER_BYTES
    out = json.loads(value)
    assert out["more"] == 200 - len(out["edits"]) > 0
    assert all(e["applied"] for e in out["edits"])  # the unapplied ones went first


def test_readme_table_has_one_row_per_pass_in_pipeline_order() -> None:
    text = (ROOT / "README.md").read_text()
    header = "| pass (policy switch, default) | may change | never changes | what the model now sees |"
    rows = text[text.index(header):].splitlines()[2:]
    rows = rows[:rows.index("")]
    names = [re.match(r"\| `(\w+)`", r).group(1) for r in rows]  # type: ignore[union-attr]
    assert names == [p.name for p in PASSES]
    for name, row in zip(names, rows):
        assert row.rstrip(" |").endswith(WHAT_THE_MODEL_SEES[name])


def test_the_diff_shows_a_prompt_line_by_line_and_no_line_is_very_long() -> None:
    """One changed line in a 40-line system prompt is one changed line of the diff (issue 22,
    item 7: the diff was one very long line per prompt)."""
    from prefixgate.proxy.cli.rewrite import WRAP, unified_diff

    lines = [f"Rule {i}: " + "be helpful and precise " * 8 for i in range(40)]
    before = {"model": "m", "messages": [{"role": "system", "content": "\n".join(lines)}]}
    changed = list(lines)
    changed[17] = "Rule 17: changed"
    after = {"model": "m", "messages": [{"role": "system", "content": "\n".join(changed)}]}
    diff = unified_diff(before, after).splitlines()
    assert all(len(x) <= WRAP + 1 for x in diff)
    removed = [x for x in diff if x.startswith("-") and not x.startswith("---")]
    added = [x for x in diff if x.startswith("+") and not x.startswith("+++")]
    assert added == ["+        | Rule 17: changed"]
    assert removed and all("Rule 17:" in x or x.strip("-| ") for x in removed)
    assert unified_diff(before, before) == ""


def test_the_dry_run_says_guarded_moves_are_off_here(tmp_path: Path) -> None:
    # the shipped policy: every move guarded, none run (no verdict offline), and the output says so
    out = json.loads(run_cli(tmp_path, "--provider", "radix", "--json").output)
    assert out["guarded"] == ["hoist_volatile", "stabilise_passages", "prune_tools",
                              "prune_history", "prune_rag"]
    assert not {e["pass"] for e in out["edits"]} & set(out["guarded"])
    assert "Request ID: req_4c1f9e27ab03d58e61" not in out["diff"]  # the id was not moved
    text = run_cli(tmp_path, "--provider", "radix").output
    assert "== guarded: hoist_volatile, stabilise_passages, prune_tools, prune_history, prune_rag ==" in text
    assert "off in this dry run" in text
    # moves set on are run and no longer listed as guarded
    on = json.loads(run_cli(tmp_path, "--provider", "radix", "--json", "--policy",
                            str(moves_policy(tmp_path))).output)
    assert on["guarded"] == ["prune_tools", "prune_history", "prune_rag"]
