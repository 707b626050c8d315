"""Mutation score of one module with mutmut (issue 21): ``make mutation MODULE=prefixgate/...``.

Tool: mutmut 3 (``docs/mutation.md`` says why). It mutates every function of MODULE (one
mutant per operator site, switched at run time by a trampoline), records which of the module's
own test files (:data:`TARGETS`, kept small so a module takes minutes on 2 shared cores) reach
each function, and runs each mutant against only those tests, in a forked child with a CPU-time
limit. Hypothesis runs under the ``ci`` profile of tests/conftest.py (derandomized, no database),
so a verdict is the same on every run.

Steps, all in ``build/mutation/<module>/`` (a fresh copy of the files git knows; the work tree is
never touched): write ``setup.cfg`` ``[mutmut]`` (``source_paths = prefixgate``,
``only_mutate = MODULE``, the test files), ``mutmut run``, read the verdicts, and sort each
mutant that was not killed:

* listed in :data:`mutation.equivalents.EQUIVALENT` with the mutated line it expects —
  ``equivalent`` (its one-line reason is there); a listed mutant whose diff no longer shows that
  line is stale and counts as survived, never silently equivalent;
* otherwise ``survived`` (printed with its diff: kill it with a test or explain it).

``mutation/results/mutation_score.json`` gets this module's entry ``{"mutants", "killed",
"equivalent", "survived"}`` (other modules' entries are kept). ``killed`` counts mutants whose
tests failed or ran past the time limit; ``survived`` includes mutants no selected test reaches.
Exit status 1 when any mutant survived.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mutation.equivalents import EQUIVALENT  # noqa: E402
from tests.paths import DATA  # noqa: E402

OUT = REPO / "mutation" / "results" / "mutation_score.json"
TOOL = "mutmut 3.8.1"
COMMAND = "make mutation MODULE=<module>  # one run per module below; HYPOTHESIS_PROFILE=ci"

R = "tests/proxy/test_routing_units.py"
SHARED = "tests/proxy/test_shared_routing.py"
RETRY = "tests/proxy/test_retry_bounds.py"
#: module -> the test files that cover it (its own unit, property and state-machine tests)
TARGETS: dict[str, list[str]] = {
    "prefixgate/proxy/routing/breaker.py": [R, SHARED, RETRY, "tests/routing/test_breaker_machine.py"],
    "prefixgate/proxy/routing/balance.py": [R, RETRY, "tests/routing/test_balance_load.py"],
    "prefixgate/proxy/routing/retries.py": [R, RETRY, "tests/routing/test_retries_pinned.py",
                                            "tests/routing/test_retries_paths.py"],
    "prefixgate/proxy/routing/kv_index.py": ["tests/kv_events/test_kv_index_pinned.py",
                                             "tests/kv_events/test_stream.py"],
    "prefixgate/proxy/routing/kv_events.py": ["tests/kv_events/test_kv_events_pinned.py",
                                              "tests/kv_events/test_kv_replay_pinned.py",
                                              "tests/kv_events/test_stream.py",
                                              "tests/kv_events/test_kv_routing.py",
                                              "tests/kv_events/test_shared_index.py"],
    "prefixgate/proxy/routing/kv_shared.py": ["tests/kv_events/test_shared_index.py",
                                              "tests/kv_events/test_shared_index_pinned.py"],
    "prefixgate/proxy/routing/shared.py": [SHARED, "tests/routing/test_breaker_machine.py",
                                           "tests/routing/test_shared_pinned.py"],
    "prefixgate/config/routing.py": [R, "tests/config/test_routing_config_pinned.py"],
    "prefixgate/proxy/http/ratelimit.py": ["tests/proxy/test_auth_and_limits.py",
                                          "tests/adversarial/test_tpm_charges_what_is_spent.py",
                                          "tests/proxy/test_ratelimit_pinned.py",
                                          "tests/proxy/test_ratelimit_refusals_count_nothing.py"],
    "prefixgate/cache/ledger/rollup.py": ["tests/cache/test_savings_math.py", "tests/cache/test_ledger_writer.py",
                                   "tests/cache/test_rollup_pinned.py"],
    "prefixgate/cache/savings/holdout_stats.py": ["tests/cache/test_savings_math.py", "tests/cache/test_time_saved.py",
                                          "tests/cache/test_holdout_pinned.py"],
    "prefixgate/cache/savings/summary.py": ["tests/cache/test_savings_math.py", "tests/cache/test_time_saved.py",
                                    "tests/cache/test_savings_pinned.py",
                                    "tests/cache/test_pd_decisions.py", "tests/cache/test_savings_unanswered.py"],
    "prefixgate/cache/ledger/attribution.py": ["tests/cache/test_attribution.py", "tests/cache/test_attribution_pinned.py"],
    "prefixgate/cache/ledger/writer.py": ["tests/cache/test_ledger_writer.py", "tests/cache/test_ledger_writer_pinned.py"],
    "prefixgate/cache/state/responses_store.py": ["tests/proxy/test_responses_store.py",
                                            "tests/cache/test_responses_store_machine.py"],
    "prefixgate/proxy/routing/fanout.py": ["tests/proxy/test_fanout.py", "tests/proxy/test_fanout_pinned.py",
                                           "tests/proxy/test_fanout_failed_writer.py"],
    "prefixgate/rewriter/analysis/ttl_choice.py": ["tests/rewriter/test_ttl_choice.py", "tests/rewriter/test_ttl_choice_pinned.py"],
    "prefixgate/cache/provider_models/token_radix.py": ["tests/cache/test_token_radix.py",
                                                        "tests/cache/test_token_radix_pinned.py"],
    "prefixgate/proxy/pipeline/exchange.py": ["tests/proxy/test_exchange_pinned.py"],
    "prefixgate/rewriter/passes/stabilise_passages.py": ["tests/rewriter/test_stabilise_passages.py",
                                                  "tests/rewriter/test_passage_order_meaning.py",
                                                  "tests/rewriter/test_stabilise_passages_pinned.py"],
    # test_spec_verify's χ² tests (12,000 draws each) cost minutes per mutant of verify_sampled;
    # test_spec_sampled_pinned pins the same rule point by point in about a second
    "prefixgate/local_engine/spec/decode.py": ["tests/engine/test_spec_step_rules.py",
                                               "tests/engine/test_spec_sampled_pinned.py"],
    "prefixgate/local_engine/sched/scheduler.py": ["tests/engine/test_scheduler_pool_pressure.py",
                                             "tests/engine/test_spec_rollback.py",
                                             "tests/engine/test_scheduler_step_rules.py"],
    # the engine-level int8 tests (test_quant, test_quant_keep) load a tokenizer and an engine per
    # test: minutes per mutant on the shared box; test_quant_layers pins the same rules in memory
    "prefixgate/local_engine/model/quant/int8.py": ["tests/engine/test_quant_layers.py",
                                         "tests/engine/test_quant_outliers.py",
                                         "tests/engine/test_quant_keep.py"],
    "prefixgate/local_engine/server/tool_mask.py": ["tests/engine/test_tool_mask_pinned.py"],
    "prefixgate/local_engine/server/constrained.py": ["tests/engine/test_constrained_pinned.py"],
    "prefixgate/proxy/bridges/responses_chat_stream.py": ["tests/proxy/test_responses_stream_pinned.py"],
    "prefixgate/proxy/bridges/responses_chat_items.py": ["tests/proxy/test_responses_items_pinned.py",
                                                        "tests/adversarial/test_responses_bridge_lossless.py"],
    "prefixgate/proxy/bridges/responses_chat.py": ["tests/proxy/test_responses_bridge_pinned.py"],
    "prefixgate/proxy/api/responses.py": ["tests/adversarial/test_responses_cross_tenant.py",
                                          "tests/proxy/test_responses_endpoint_pinned.py"],
    # issue 38: the modules whose tests held the one configuration a bug hides in
    "prefixgate/proxy/routing/pd/plan.py": ["tests/cache/test_pd_plan.py", "tests/cache/test_pd_plan_instances.py",
                                            "tests/cache/test_pd_plan_pinned.py"],
    "prefixgate/rewriter/passes/canonicalize_tools.py": ["tests/rewriter/test_canonicalize_tools.py",
                                                         "tests/rewriter/test_canonicalize_tools_new_tools.py"],
    "prefixgate/rewriter/analysis/volatile_spans.py": ["tests/rewriter/test_per_request_line.py",
                                                       "tests/rewriter/test_hoist_volatile.py",
                                                       "tests/rewriter/test_volatile_spans_pinned.py"],
    "prefixgate/local_engine/model/quant/screened_head.py": ["tests/engine/test_screened_head_adversarial.py",
                                                             "tests/engine/test_screened_head_worst_estimate.py"],
    "prefixgate/proxy/http/auth.py": ["tests/adversarial/test_tpm_charges_what_is_spent.py",
                                      "tests/adversarial/test_tpm_refunds_by_status.py",
                                      "tests/proxy/test_auth_and_limits.py",
                                      "tests/proxy/test_auth_pinned.py"],
    "prefixgate/proxy/bridges/responses_identity.py": ["tests/proxy/test_responses_passthrough_store.py",
                                                       "tests/proxy/test_responses_api.py",
                                                       "tests/proxy/test_responses_identity_pinned.py"],
    "prefixgate/cache/savings/stand_back.py": ["tests/cache/test_stand_back.py",
                                               "tests/cache/test_stand_back_late_rows.py"],
    "prefixgate/proxy/api/count_tokens.py": ["tests/proxy/test_count_tokens_estimate_roles.py",
                                             "tests/proxy/test_side_endpoints.py",
                                             "tests/adversarial/test_count_tokens_hostile_backend.py",
                                             "tests/proxy/test_count_tokens_paths.py"],
    "prefixgate/cache/guard/sequential.py": ["tests/guard/test_sequential.py"],
    "prefixgate/cache/guard/decisions.py": ["tests/guard/test_decisions.py"],
    "prefixgate/cache/guard/verdicts.py": ["tests/guard/test_verdicts.py"],
    "prefixgate/cache/guard/budget.py": ["tests/guard/test_budget.py"],
}

# mutmut's exit-code vocabulary (mutmut/stats.py)
KILLED_CODES = {1, 3, 36, 24, -24, 152, 255}  # test failure, pytest internal error, CPU-time limit


def scratch_copy(dest: Path) -> None:
    """Copy the files git knows (tracked + untracked, not ignored) of REPO into ``dest``."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def setup_cfg(module: str, tests: list[str], others: list[str]) -> str:
    """The ``[mutmut]`` section for ``module``, its ``tests`` and the ``others`` top-level
    entries to copy beside the mutants (docs/, bench/: tests read fixtures from them)."""
    lines = ["[mutmut]", "source_paths = prefixgate", f"only_mutate = {module}",
             "also_copy ="] + [f"    {o}" for o in others]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -q",
              "timeout_multiplier = 10.0", "timeout_constant = 5.0", "track_dependencies = false",
              "use_git_change_detection = false"]
    return "\n".join(lines) + "\n"


def mutmut(work: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mutmut ARGS`` in ``work`` (no PYTHONPATH: mutmut puts mutants/ first)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # one torch / OpenMP thread: a second thread spinning in a forked child counts against the
    # child's CPU-time limit, and a run on the shared box then reads as "timed out" (killed)
    # for mutants whose tests in fact pass (seen on spec/decode.py and model/quant/int8.py)
    env.update(HYPOTHESIS_PROFILE="ci", PREFIXGATE_DATA_DIR=str(DATA), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PREFIXGATE_HANG_GUARD_S="30")
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, text=True,
                          capture_output=capture)


_DIFFS = """
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = Path(sys.argv[1]), json.loads(sys.stdin.read())
print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))
"""


def diffs_of(work: Path, module: str, names: list[str]) -> dict[str, str]:
    """Each mutant's diff (what ``mutmut show`` prints), all in one process (``mutmut show``
    per mutant costs an interpreter start each, minutes for a module's survivors)."""
    if not names:
        return {}
    got = subprocess.run([sys.executable, "-c", _DIFFS, module], cwd=work, input=json.dumps(names),
                         text=True, capture_output=True, check=True)
    return json.loads(got.stdout)


def mutated_lines(diff: str) -> list[str]:
    """The added lines of a mutant's diff, stripped."""
    return [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def classify(module: str, verdicts: dict[str, int | None], diffs: dict[str, str]) -> dict[str, Any]:
    """Figures for ``module`` and the list of unexplained survivors (name, diff, why)."""
    known = EQUIVALENT.get(module, {})
    figures = {"mutants": len(verdicts), "killed": 0, "equivalent": 0, "survived": 0}
    unexplained: list[tuple[str, str, str]] = []
    for name, code in sorted(verdicts.items()):
        if code in KILLED_CODES:
            figures["killed"] += 1
            continue
        short = name.rsplit(".", 1)[-1]
        entry = known.get(short)
        if entry is not None and entry[0].strip() in mutated_lines(diffs.get(name, "")):
            figures["equivalent"] += 1
            continue
        figures["survived"] += 1
        why = "no selected test reaches it" if code in (5, 33) else f"exit code {code}"
        if entry is not None:
            why += f"; STALE equivalent entry (expected the line {entry[0]!r})"
        unexplained.append((name, diffs.get(name, ""), why))
    return {"figures": figures, "unexplained": unexplained}


def read_verdicts(work: Path, module: str) -> dict[str, int | None]:
    """``{mutant name: exit code}`` from mutmut's meta file of ``module``."""
    meta = json.loads((work / "mutants" / (module + ".meta")).read_text())
    return meta["exit_code_by_key"]


def record(module: str, figures: dict[str, int], out: Path) -> None:
    """Write ``module``'s figures into ``out``, keeping the other modules' entries."""
    data = json.loads(out.read_text()) if out.exists() else {}
    modules = data.get("modules", {})
    modules[module] = figures
    order = {m: i for i, m in enumerate(TARGETS)}
    modules = dict(sorted(modules.items(), key=lambda kv: order.get(kv[0], len(order))))
    out.write_text(json.dumps({"command": COMMAND, "tool": TOOL, "modules": modules}, indent=2) + "\n")


DOCS = REPO / "docs" / "mutation.md"
BEGIN, END = "<!-- mutation-results:begin -->", "<!-- mutation-results:end -->"


def docs_section(data: dict[str, Any]) -> str:
    """The results section of docs/mutation.md: the figures of every module recorded, then each
    equivalent mutant with its mutated line and reason."""
    lines = [BEGIN, "", "| module | mutants | killed | equivalent | survived | killed of non-equivalent |",
             "|---|---:|---:|---:|---:|---:|"]
    for mod, f in data.get("modules", {}).items():
        live = f["mutants"] - f["equivalent"]
        share = f"{100 * f['killed'] / live:.1f} %" if live else "-"
        lines.append(f"| `{mod}` | {f['mutants']} | {f['killed']} | {f['equivalent']} | {f['survived']} | {share} |")
    lines += ["", f"Command: `{data.get('command', COMMAND)}`; tool: {data.get('tool', TOOL)}.", "",
              "### Equivalent mutants", ""]
    for mod, entries in EQUIVALENT.items():
        lines.append(f"`{mod}`:")
        lines.append("")
        for name, (line, why) in entries.items():
            lines.append(f"- `{name}` — `{line}`: {why}")
        lines.append("")
    return "\n".join(lines + [END])


def write_docs(out: Path) -> None:
    """Rewrite the results section of docs/mutation.md from ``out`` and the equivalents."""
    data = json.loads(out.read_text()) if out.exists() else {}
    text = DOCS.read_text()
    a, b = text.index(BEGIN), text.index(END) + len(END)
    DOCS.write_text(text[:a] + docs_section(data) + text[b:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", choices=sorted(TARGETS))
    ap.add_argument("--docs", action="store_true",
                    help="only rewrite docs/mutation.md's results section from the JSON and the equivalents")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run in parallel (mutmut --max-children)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep", action="store_true", help="reuse build/mutation/<module> (mutmut's cache)")
    ap.add_argument("--rerun", action="store_true",
                    help="run again, with the current test files, only the mutants the last run left "
                         "unexplained (mutmut collects the new tests' coverage first)")
    ap.add_argument("--rescore", action="store_true",
                    help="no run: classify the verdicts of the last run again (after editing the equivalents)")
    args = ap.parse_args()
    if args.docs:
        write_docs(args.out)
        return 0
    if not args.module:
        ap.error("--module is required")
    module = args.module
    tests = [t for t in TARGETS[module] if (REPO / t).exists()]
    work = REPO / "build" / "mutation" / re.sub(r"[^A-Za-z0-9]+", "_", module)
    if args.rescore:
        return score(work, module, args.out)
    if args.rerun:
        return rerun(work, module, tests, args.jobs, args.out)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if not (work / "prefixgate").exists():
        work.mkdir(parents=True, exist_ok=True)
        scratch_copy(work)
    others = sorted(p.name for p in work.iterdir() if p.name not in ("prefixgate", "tests", "mutants",
                                                                      "setup.cfg", "pyproject.toml"))
    (work / "setup.cfg").write_text(setup_cfg(module, tests, others))
    print(f"mutmut over {module} with {len(tests)} test files: {' '.join(tests)}", flush=True)
    run = mutmut(work, "run", "--max-children", str(args.jobs))
    if run.returncode not in (0, None):
        print(f"mutmut run failed (exit {run.returncode})")
        return 2
    return score(work, module, args.out)


def rerun(work: Path, module: str, tests: list[str], jobs: int, out: Path) -> int:
    """Refresh ``work``'s tests/ from the work tree, run only the unexplained survivors of the
    last run (by name; every other verdict stands, the source being unchanged), score."""
    verdicts = read_verdicts(work, module)
    diffs = diffs_of(work, module, [name for name, code in verdicts.items() if code not in KILLED_CODES])
    todo = [name for name, _, _ in classify(module, verdicts, diffs)["unexplained"]]
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", module], cwd=REPO).returncode
    if changed or (REPO / module).read_text() != (work / module).read_text():
        raise SystemExit(f"{module} changed since the last run: run it whole again")
    cfg = setup_cfg(module, tests, sorted(
        p.name for p in work.iterdir() if p.name not in ("prefixgate", "tests", "mutants", "setup.cfg",
                                                        "pyproject.toml")))
    if cfg != (work / "setup.cfg").read_text():
        raise SystemExit(f"the test selection of {module} changed since the last run: run it whole again")
    shutil.rmtree(work / "tests")
    shutil.copytree(REPO / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"rerunning {len(todo)} mutants of {module}", flush=True)
    if todo:
        mutmut(work, "run", "--max-children", str(jobs), *todo)
    return score(work, module, out)


def score(work: Path, module: str, out: Path) -> int:
    """Classify the verdicts of the run in ``work``, print the unexplained survivors, record."""
    verdicts = read_verdicts(work, module)
    diffs = diffs_of(work, module, [name for name, code in verdicts.items() if code not in KILLED_CODES])
    result = classify(module, verdicts, diffs)
    for name, diff, why in result["unexplained"]:
        print(f"\n### SURVIVED {name} ({why})\n{diff}")
    record(module, result["figures"], out)
    write_docs(out)
    print(json.dumps({module: result["figures"]}), "->", out)
    return 1 if result["figures"]["survived"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
