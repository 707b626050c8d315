"""Single-point mutants for :mod:`mutation.check`: bugs a real change could introduce.

Each mutant: ``id``; ``file`` (repo-relative); ``original`` — an exact snippet that must occur
ONCE in the file (the check refuses a stale mutant rather than silently skipping it);
``replacement``; ``tests`` — the test files that must catch it (kept small: the whole check runs
in minutes); ``bug`` — the real defect it imitates. Covers the rewriter passes and validator,
both bridges, the relay and usage reader, the ledger, the cost model and price table, the radix
cache, the KV pool and the scheduler (issue 14).
"""

from __future__ import annotations

from typing import TypedDict

from mutation.score import TARGETS


class Mutant(TypedDict):
    """One mutant (module docstring)."""

    id: str
    file: str
    original: str
    replacement: str
    tests: list[str]
    bug: str


SAFE = "tests/rewriter/test_passes_without_safety_net.py"
CANON = ["tests/rewriter/test_canonicalize_tools.py", SAFE]
BREAKS = ["tests/rewriter/test_breakpoints_lookback_edge.py", "tests/rewriter/test_breakpoints.py", "tests/rewriter/test_breakpoints_nested.py", SAFE]
PTOOLS = ["tests/pruning/test_prune_tools.py", "tests/pruning/test_prune_tools_required.py", SAFE]
PRAG = ["tests/pruning/test_prune_rag_budget_edge.py", "tests/pruning/test_prune_rag.py", "tests/pruning/test_prune_rag_user_content.py", SAFE]
PHIST = ["tests/pruning/test_prune_history.py", "tests/pruning/test_prune_history_keeps_task.py",
         "tests/pruning/test_pruning_properties.py", SAFE]
HOIST = ["tests/rewriter/test_hoist_volatile.py", SAFE]
VALID = ["tests/rewriter/test_validate.py"]
A2O = ["tests/proxy/test_bridge_answer_mappings.py", "tests/proxy/test_anthropic.py",
       "tests/proxy/test_bridge_lossless.py"]
O2A = ["tests/proxy/test_bridge_answer_mappings.py", "tests/proxy/test_bridge_lossless.py",
       "tests/proxy/test_anthropic.py"]
RELAY = ["tests/proxy/test_relay_last_event.py", "tests/proxy/test_relay_stream.py", "tests/adversarial/test_bridged_stream_without_final_event.py",
         "tests/adversarial/test_stream_cut_or_hung_upstream.py"]
LEDGER = ["tests/proxy/test_ledger_sessions.py", "tests/proxy/test_cli_report_replay.py"]
COST = ["tests/cache/test_prices.py", "tests/cache/test_anthropic_model.py",
        "tests/cache/test_openai_model.py"]
RADIX = ["tests/engine/test_radix_cache.py", "tests/engine/test_radix_lock_shapes.py",
         "tests/engine/test_radix_machine_shared_prefixes.py"]
SCHED = ["tests/engine/test_scheduler_pool_pressure.py"]
SPEC = ["tests/engine/test_spec_rollback.py", "tests/engine/test_spec_verify.py"]
ROUTE = ["tests/routing/test_breaker_machine.py", "tests/routing/test_retries_pinned.py"]
LIMIT = ["tests/proxy/test_ratelimit_pinned.py"]
ATTR = ["tests/cache/test_attribution_pinned.py"]
SPEC_STEP = ["tests/engine/test_spec_step_rules.py"]
SCHED_STEP = ["tests/engine/test_scheduler_step_rules.py", "tests/engine/test_scheduler_pool_pressure.py"]
QUANT = ["tests/engine/test_quant_layers.py"]
TOOLS = ["tests/engine/test_tool_constraint_pinned.py"]
RESP = ["tests/proxy/test_responses_api.py", "tests/proxy/test_bridge_lossless.py"]
CF = ["tests/proxy/test_measured_counterfactual.py", "tests/proxy/test_savings_e2e.py",
      "tests/proxy/test_counterfactual_tokens.py"]


def T(part: str) -> list[str]:
    """The test files :data:`mutation.score.TARGETS` gives the one module whose path holds
    ``part``."""
    (tests,) = [t for mod, t in TARGETS.items() if part in mod]
    return tests


def m(id: str, file: str, original: str, replacement: str, tests: list[str], bug: str) -> Mutant:
    """Build one :class:`Mutant`."""
    return Mutant(id=id, file=file, original=original, replacement=replacement, tests=tests, bug=bug)


MUTANTS: list[Mutant] = [
    # -- rewriter passes ------------------------------------------------------------------------
    m("canon_sort_reversed", "prefixgate/rewriter/passes/canonicalize_tools.py",
      "return sorted(tools, key=lambda t: t.name), None",
      "return sorted(tools, key=lambda t: t.name, reverse=True), None", CANON,
      "wrong sort direction"),
    m("canon_drops_a_tool", "prefixgate/rewriter/passes/canonicalize_tools.py",
      "canon, mem = [canonical_tool(t, sort_props) for t in ordered], {}",
      "canon, mem = [canonical_tool(t, sort_props) for t in ordered[:-1] or ordered], {}", CANON,
      "a tool lost while reordering (the audit's canonicalize_tools mutant)"),
    m("canon_sorts_property_order", "prefixgate/rewriter/passes/canonicalize_tools.py",
      "keys = list(v) if (_in_names and not sort_properties) else sorted(v)",
      "keys = sorted(v)", CANON, "the author's argument order sorted away"),
    m("canon_markers_follow_tools", "prefixgate/rewriter/passes/canonicalize_tools.py",
      "canon = _keep_marker_positions(prompt.tools, canon)", "canon = list(canon)", CANON,
      "client cache_control markers move with their tool instead of keeping their position"),
    m("bp_budget_ignores_client", "prefixgate/rewriter/passes/breakpoints.py",
      "budget = ANTHROPIC_MAX_BREAKPOINTS - breakpoint_count(prompt)",
      "budget = ANTHROPIC_MAX_BREAKPOINTS", BREAKS,
      "the planner ignores the client's markers (the audit's breakpoint mutant)"),
    m("bp_ignores_min_cacheable", "prefixgate/rewriter/passes/breakpoints.py",
      "if cum[i] < floor:", "if cum[i] < 0:", BREAKS, "marker below the minimum cacheable length"),
    m("bp_marks_after_volatile", "prefixgate/rewriter/passes/breakpoints.py",
      "volatile = next((i for i, u in enumerate(units) if _is_volatile(u)), len(units))",
      "volatile = len(units)", BREAKS, "a breakpoint on or after the volatile note"),
    m("bp_lookback_off_by_one", "prefixgate/rewriter/passes/breakpoints.py",
      "if b - a > ANTHROPIC_LOOKBACK_BLOCKS]", "if b - a > ANTHROPIC_LOOKBACK_BLOCKS + 1]",
      BREAKS, "lookback spacing off by one"),
    m("ptools_forgets_history_calls", "prefixgate/rewriter/passes/prune_tools.py",
      "req = used_tool_names(prompt) | set(ctx.settings.pinned_tools)",
      "req = set(ctx.settings.pinned_tools)", PTOOLS, "a tool the history calls is pruned (B06)"),
    m("ptools_forgets_tool_choice", "prefixgate/rewriter/passes/prune_tools.py",
      "req.update(tool_choice_names(prompt))", "req.update(())", PTOOLS,
      "the tool_choice target is pruned"),
    m("ptools_forgets_system_words", "prefixgate/rewriter/passes/prune_tools.py",
      "req.update(t.name for t in tools if t.name in words)", "req.update(())", PTOOLS,
      "a tool the system prompt says to call is pruned"),
    m("prag_best_not_always_kept", "prefixgate/rewriter/passes/prune_rag.py",
      "if not kept or used + tokens[i] <= budget:", "if used + tokens[i] <= budget:", PRAG,
      "dropped condition: the best passage over budget is dropped too"),
    m("prag_budget_off_by_one", "prefixgate/rewriter/passes/prune_rag.py",
      "if sum(tokens) <= budget:", "if sum(tokens) < budget:", PRAG,
      "a retrieval exactly at budget is pruned"),
    m("phist_drops_the_task", "prefixgate/rewriter/passes/prune_history.py",
      "keep = plan.keep if plan.drop else protected_head(messages)",
      "keep = plan.keep if plan.drop else 0", PHIST, "compaction drops the first user turn"),
    m("phist_elides_newest_results", "prefixgate/rewriter/passes/prune_history.py",
      'if m.role == "tool" and (m.tool_call_id or "") not in last_calls:',
      'if m.role == "tool":', PHIST, "the newest tool round is elided"),
    m("phist_splits_a_turn", "prefixgate/rewriter/passes/prune_history.py",
      "drop = e - keep", "drop = e - keep + 1", PHIST,
      "off by one: compaction cuts into the next turn (orphan results)"),
    m("hoist_loses_a_note", "prefixgate/rewriter/analysis/note_placement.py",
      'and moved_lines else list(moved_lines)', 'and moved_lines else list(moved_lines[1:])', HOIST,
      "a hoisted span is not carried in the note (meaning lost)"),
    m("validate_ttl_order_inverted", "prefixgate/rewriter/wire/validate.py",
      'elif t == "1h" and seen_5m:', 'elif t == "1h" and not seen_5m:', VALID,
      "inverted condition"),
    m("validate_breakpoint_limit", "prefixgate/rewriter/wire/validate.py",
      "if len(ttls) > MAX_BREAKPOINTS:", "if len(ttls) > MAX_BREAKPOINTS + 1:", VALID,
      "off by one: 5 breakpoints accepted"),
    # -- bridges ----------------------------------------------------------------------------------
    m("a2o_usage_input_includes_cached", "prefixgate/proxy/bridges/anthropic_openai.py",
      '"input_tokens": max(0, prompt - cached)', '"input_tokens": prompt', A2O,
      "B08: cached tokens counted twice"),
    m("a2o_length_stop_reason", "prefixgate/proxy/bridges/anthropic_openai.py",
      '"length": "max_tokens"', '"length": "end_turn"', A2O, "wrong stop-reason mapping"),
    m("a2o_stream_usage_dropped", "prefixgate/proxy/bridges/anthropic_openai.py",
      "self.usage = usage_to_anthropic(filled_usage(self.last_usage, self.engine))",
      "self.usage = usage_to_anthropic({})",
      A2O, "the stream's usage chunk is ignored"),
    m("a2o_stream_tool_delta_index", "prefixgate/proxy/bridges/anthropic_openai.py",
      '"type": "content_block_delta", "index": self.tool_blocks[i],',
      '"type": "content_block_delta", "index": self.block,', A2O,
      "parallel tool-call arguments land in the wrong block"),
    m("o2a_cached_tokens_dropped", "prefixgate/proxy/bridges/openai_anthropic.py",
      '"prompt_tokens_details": {"cached_tokens": u.cached_tokens or 0}',
      '"prompt_tokens_details": {"cached_tokens": 0}', O2A, "B07: cache reads not reported"),
    m("o2a_max_tokens_finish", "prefixgate/proxy/bridges/openai_anthropic.py",
      '"max_tokens": "length"', '"max_tokens": "stop"', O2A, "wrong finish_reason mapping"),
    m("o2a_tool_index_constant", "prefixgate/proxy/bridges/openai_anthropic.py",
      "i = self.tool_index[obj.get(\"index\", 0)] = len(self.tool_index)",
      "i = self.tool_index[obj.get(\"index\", 0)] = 0", O2A,
      "every streamed tool call gets index 0"),
    m("o2a_usage_chunk_inverted", "prefixgate/proxy/bridges/openai_anthropic.py",
      "if self.include_usage:", "if not self.include_usage:", O2A,
      "usage chunk sent when not asked for, missing when asked"),
    # -- relay and usage --------------------------------------------------------------------------
    m("relay_bridged_end_unchecked", "prefixgate/proxy/upstream/relay.py",
      'if w.done:\n            self.status = "ok"',
      'if w.done or self.mapper is not None:\n            self.status = "ok"',
      RELAY, "a bridged stream cut before its final event ends as if complete"),
    m("relay_flush_dropped", "prefixgate/proxy/upstream/relay.py",
      "tail = self._ended(splitter.flush())", 'tail = self._ended(b"")', RELAY,
      "the last event without a trailing blank line is lost"),
    m("relay_ttft_is_last_event", "prefixgate/proxy/upstream/relay.py",
      "if self.first_content is None:", "if True:", RELAY + LEDGER,
      "TTFT overwritten by every later content event"),
    m("relay_tpot_off_by_one", "prefixgate/proxy/upstream/relay.py",
      "* 1e3 / (output_tokens - 1)", "* 1e3 / output_tokens", RELAY + LEDGER,
      "TPOT divides by tokens instead of intervals"),
    m("usage_write_not_in_prompt", "prefixgate/proxy/core/usage.py",
      "inp + (read or 0) + (write or 0)", "inp + (read or 0)", LEDGER + A2O,
      "B07: cache writes left out of prompt_tokens"),
    # -- ledger and cost ---------------------------------------------------------------------------
    m("ledger_rows_newest_first", "prefixgate/cache/ledger/store.py",
      'FROM requests WHERE ts >= ?{where} ORDER BY id",', 'FROM requests WHERE ts >= ?{where} ORDER BY id DESC",',
      LEDGER,
      "rows come back in the wrong order"),
    m("cost_1h_writes_counted_twice", "prefixgate/cache/savings/cost.py",
      "write_5m = outcome.cache_write_tokens - outcome.cache_write_1h_tokens",
      "write_5m = outcome.cache_write_tokens", COST, "1h writes also billed at the 5m rate"),
    m("cost_reads_at_input_price", "prefixgate/cache/savings/cost.py",
      "cached_read_usd=outcome.cached_read_tokens * p.cached_input / 1e6",
      "cached_read_usd=outcome.cached_read_tokens * p.input / 1e6", COST,
      "wrong field: cache reads billed at the input price"),
    m("prices_write_multipliers_swapped", "prefixgate/config/prices.py",
      "round(inp * 1.25, 6), round(inp * 2.0, 6)", "round(inp * 2.0, 6), round(inp * 1.25, 6)",
      COST, "5m and 1h write multipliers swapped"),
    m("prices_first_prefix_wins", "prefixgate/config/prices.py",
      "if m.startswith(prefix) and len(prefix) > len(best):", "if m.startswith(prefix) and not best:",
      COST, "first matching id prefix instead of the longest (opus-4-5 priced as opus-4)"),
    # -- radix cache -------------------------------------------------------------------------------
    m("radix_evicts_locked_leaf", "prefixgate/local_engine/kv/radix_cache.py",
      "elif not n.is_root and n.ref_count == 0:", "elif not n.is_root:", RADIX,
      "a locked leaf is evicted"),
    m("radix_cascades_into_locked_parent", "prefixgate/local_engine/kv/radix_cache.py",
      "if not parent.is_root and not parent.children and parent.ref_count == 0:",
      "if not parent.is_root and not parent.children:", RADIX,
      "the locked interior node goes when its unlocked child is evicted (issue 14)"),
    m("radix_split_loses_lock", "prefixgate/local_engine/kv/radix_cache.py",
      "upper.ref_count = node.ref_count", "upper.ref_count = 0", RADIX,
      "split of a locked edge leaves the upper half unlocked"),
    m("radix_insert_off_by_one", "prefixgate/local_engine/kv/radix_cache.py",
      "if pos < usable:", "if pos < usable - 1:", RADIX, "a one-token suffix is never inserted"),
    # -- KV pool and scheduler ---------------------------------------------------------------------
    m("pool_alloc_bound_off_by_one", "prefixgate/local_engine/kv/pool.py",
      "if n > len(self._free):", "if n > len(self._free) + 1:", SCHED,
      "allocation past the free list hands out fewer pages"),
    m("pool_free_pages_of_every_slot", "prefixgate/local_engine/kv/pool.py",
      "pages = slots if ps == 1 else [s // ps for s in slots[::ps]]",
      "pages = slots if ps == 1 else [s // ps for s in slots]", SCHED,
      "a page returned once per slot (double free)"),
    m("sched_retracts_oldest", "prefixgate/local_engine/sched/scheduler.py",
      "victim = self.running[-1]", "victim = self.running[0]", SCHED,
      "retraction picks the oldest request, not the newest"),
    m("sched_leaks_duplicate_slots", "prefixgate/local_engine/sched/kv_manager.py",
      "self.pool.free(seq.slots[own_from:prefix])  # duplicates of what the tree holds",
      "pass  # duplicates of what the tree holds", SCHED,
      "slots duplicating tree content never freed (leak)"),
    m("sched_admit_without_lock", "prefixgate/local_engine/sched/kv_manager.py",
      "self.cache.lock(match.handle)\n        seq.handle, seq.slots",
      "seq.handle, seq.slots", SCHED,
      "a running request's cached prefix is not locked (eviction frees its slots)"),
    m("sched_cache_prompt_keeps_old_lock", "prefixgate/local_engine/sched/kv_manager.py",
      "        if seq.handle is not None:\n            self.cache.unlock(seq.handle)\n        dup_from",
      "        dup_from", SCHED, "the shorter lock is never released (lock leak)"),
    m("sched_page_spare_ignored", "prefixgate/local_engine/sched/kv_manager.py",
      "spare = (-len(seq.slots)) % self.ps\n        need", "spare = 0\n        need", SCHED,
      "a partly filled page is ignored: a page allocated per token"),
    # -- speculative decoding ---------------------------------------------------------------------
    m("spec_rollback_leaks_pages", "prefixgate/local_engine/sched/kv_manager.py",
      "        self.pool.free(seq.slots[first_free:])\n", "", SPEC,
      "the pages of rejected draft tokens never return to the pool"),
    m("spec_residual_keeps_rejected", "prefixgate/local_engine/spec/decode.py",
      "            residual[x] = 0.0\n", "", SPEC,
      "after rejecting x the resample may draw x again (distribution skewed toward drafts)"),
    m("spec_greedy_accepts_one_past_mismatch", "prefixgate/local_engine/spec/decode.py",
      "    while m < len(draft) and draft[m] == target[m]:",
      "    while m < len(draft) and (m == 0 or draft[m - 1] == target[m - 1]):", SPEC,
      "greedy verification accepts the first mismatching draft token"),
    # -- routing, limits, attribution (issue 21: the two real bugs found, and the audit's classes) --
    m("shared_same_ms_news_dropped", "prefixgate/proxy/routing/shared.py",
      'if self._applied.get(name, float("-inf")) > stamp:',
      'if self._applied.get(name, float("-inf")) >= stamp:', ROUTE,
      "a breaker reopening stamped in the same millisecond as the closing a peer applied is dropped"),
    m("retries_ties_by_name_alone", "prefixgate/proxy/routing/retries.py",
      "key=lambda i: (loads[i], rank[i]))", "key=lambda i: (loads[i], i))", ROUTE,
      "equally loaded next deployments always in the group's order, whatever the key"),
    m("ratelimit_refusal_counted", "prefixgate/proxy/http/ratelimit.py",
      '            if rpm is not None and c[0] >= rpm:\n                return Refusal("requests", rpm, left)',
      '            if rpm is not None and c[0] >= rpm:\n                c[0] += 1\n'
      '                return Refusal("requests", rpm, left)', LIMIT,
      "a refused request still counted against the window"),
    m("attribution_remainder_double_counts", "prefixgate/cache/ledger/attribution.py",
      "rest = total - sum(out.values())", "rest = total", ATTR,
      "the unattributed remainder repeats the whole saving: the parts no longer add up"),
    # -- issue 21, round two: the audit's classes (each module's tests: mutation/score.py TARGETS) --
    m("retries_retried_answer_not_released", "prefixgate/proxy/routing/retries.py",
      "                    await resp.aclose()\n                release()\n",
      "                    await resp.aclose()\n", T("retries"),
      "a retried response's in-flight count is never released on the retry-status path"),
    m("retries_next_is_most_loaded", "prefixgate/proxy/routing/retries.py",
      "key=lambda i: (loads[i], rank[i]))", "key=lambda i: (-loads[i], rank[i]))", T("retries"),
      "the next deployment is the most loaded one"),
    m("breaker_success_keeps_streak", "prefixgate/proxy/routing/breaker.py",
      "self._note(True)\n        self.consecutive = 0\n", "self._note(True)\n", T("breaker"),
      "a success does not reset the consecutive-failure streak"),
    m("breaker_peer_closes_half_open", "prefixgate/proxy/routing/breaker.py",
      "if self.state == OPEN:\n            self.state, self.consecutive",
      "if self.state != CLOSED:\n            self.state, self.consecutive", T("breaker"),
      "a peer's success closes a half-open breaker whose own probe is in flight"),
    m("balance_replaced_key_keeps_load", "prefixgate/proxy/routing/balance.py",
      "            self._live[held[0]] -= 1\n", "", T("balance"),
      "a re-placed session key never decrements the load of where it was"),
    m("balance_cap_off_by_one", "prefixgate/proxy/routing/balance.py",
      "if self._live[names[i]] < cap)", "if self._live[names[i]] <= cap)", T("balance"),
      "the bounded-load capacity floor admits one more than the cap"),
    m("shared_load_refreshed_after_expiry", "prefixgate/proxy/routing/shared.py",
      "> self.load_ttl_s / 2):", "> self.load_ttl_s):", T("routing/shared"),
      "a live load entry is rewritten only after it expired (others see the load vanish)"),
    m("routing_fallback_loses_model", "prefixgate/config/routing.py",
      "if isinstance(f, str) else f)",
      "if isinstance(f, str) else FallbackTarget(backend=f.backend, model=self.model))",
      T("config/routing"), "a fallback's own model name replaced by the route's"),
    m("ratelimit_retry_after_rounded_down", "prefixgate/proxy/http/ratelimit.py",
      "max(1, math.ceil((w + 1) * WINDOW_S - now))", "max(1, math.floor((w + 1) * WINDOW_S - now))",
      T("ratelimit"), "retry-after rounded down: the client retries before the window turns"),
    m("responses_cache_key_overridden", "prefixgate/proxy/bridges/responses_identity.py",
      "if key in rewritten.body and key not in body:", "if key in rewritten.body:", RESP,
      "the client's own prompt_cache_key overridden by the rewriter's"),
    m("responses_items_out_of_order", "prefixgate/proxy/bridges/responses_chat_stream.py",
      "[it for _, it in sorted(done, key=lambda d: d[0])]", "[it for _, it in done]", RESP,
      "the final response's output items in kind order, not output_index order"),
    m("responses_failed_stream_stored", "prefixgate/proxy/bridges/responses_chat_stream.py",
      '        return out + [self._ev("response.failed", response=r)]',
      '        if self.on_done is not None:\n            self.on_done(r)\n'
      '        return out + [self._ev("response.failed", response=r)]', RESP,
      "a failed stream stored as a response"),
    m("responses_store_replace_counted_twice", "prefixgate/cache/state/responses_store.py",
      "            self._drop(rec.id)\n            if size", "            if size", T("responses_store"),
      "a replaced entry counted twice against the byte bound"),
    m("token_radix_lru_is_fifo", "prefixgate/cache/provider_models/token_radix.py",
      "            child.last_access = now\n            pos += n", "            pos += n",
      T("token_radix"), "a match does not refresh recency: LRU turned FIFO"),
    m("token_radix_kept_parent_evicted", "prefixgate/cache/provider_models/token_radix.py",
      "and not parent.children and id(parent) not in keep:", "and not parent.children:",
      T("token_radix"), "the parent of an evicted leaf is evicted although the insert keeps it"),
    m("savings_zero_counts_as_hit", "prefixgate/cache/savings/summary.py",
      "sum(1 for c in known if c > 0)", "sum(1 for c in known if c >= 0)", T("cache/savings/summary"),
      "a request with 0 cached tokens counted into the hit rate"),
    m("savings_top_breaks_ascending", "prefixgate/cache/savings/top_break.py",
      'key=lambda e: (-e["tokens_lost"], -e["count"]))[:limit]',
      'key=lambda e: (e["tokens_lost"], -e["count"]))[:limit]',
      ["tests/proxy/test_report_top_break.py", "tests/cache/test_span_reuse_savings.py"],
      "top-N cache breaks sorted the wrong way (the smallest losses first)"),
    m("savings_writes_counted_uncached", "prefixgate/cache/savings/summary.py",
      'max(0, d.get("usage_prompt", 0) - read - write)', 'max(0, d.get("usage_prompt", 0) - read)',
      T("cache/savings/summary"), "cache writes counted as uncached tokens"),
    m("rollup_prompt_without_cached", "prefixgate/cache/ledger/rollup.py",
      '"prompt_tokens": prompt or 0,', '"prompt_tokens": (prompt or 0) - (cached or 0),',
      T("rollup"), "prompt totals exclude the cached tokens"),
    m("holdout_min_is_max", "prefixgate/cache/savings/holdout_stats.py",
      "small = min(len(rewritten), len(holdout)) < MIN_PER_ARM",
      "small = max(len(rewritten), len(holdout)) < MIN_PER_ARM", T("holdout"),
      "the too-few-samples rule reads the larger arm, not the smaller"),
    m("holdout_includes_errors", "prefixgate/cache/savings/holdout_stats.py",
      'rs = [r for r in records if (r.get("status") or "ok") == "ok"', "rs = [r for r in records if True",
      T("holdout"), "errored requests included in the holdout comparison"),
    m("exchange_counterfactual_not_recorded", "prefixgate/proxy/pipeline/exchange.py",
      "        measured_counterfactual(self.row)\n", "", CF,
      "a row's measured counterfactual is never recorded"),
    m("stabilise_moves_marked_run", "prefixgate/rewriter/passes/stabilise_passages.py",
      'citations_enabled(r) or isinstance(r.get("cache_control"), dict)', "citations_enabled(r)",
      ["tests/rewriter/test_stabilise_passages.py"], "a run with a cache_control marker is reordered"),
    m("ttl_tool_results_ignored", "prefixgate/rewriter/analysis/ttl_choice.py",
      'if last.role == "tool" or any(b.type == "tool_result" for b in last.blocks):',
      'if last.role == "tool":', T("ttl_choice"), "an Anthropic tool_result turn counted as the user's"),
    m("ttl_oldest_gaps_kept", "prefixgate/rewriter/analysis/ttl_choice.py",
      "round(now_s - float(last), 1)][-MAX_GAPS:]", "round(now_s - float(last), 1)][:MAX_GAPS]",
      T("ttl_choice"), "the oldest gaps kept instead of the newest"),
    m("fanout_failed_writer_warms", "prefixgate/proxy/routing/fanout.py",
      "if not ok or started is None:", "if started is None:", T("fanout"),
      "a failed writer still marks the prefix warm"),
    m("fanout_ewma_swapped", "prefixgate/proxy/routing/fanout.py",
      "(1 - EWMA_WEIGHT) * self.ttft_ewma_s + EWMA_WEIGHT * ttft)",
      "EWMA_WEIGHT * self.ttft_ewma_s + (1 - EWMA_WEIGHT) * ttft)", T("fanout"), "EWMA weights swapped"),
    m("ledger_writer_not_woken", "prefixgate/cache/ledger/writer.py",
      "                self._cv.notify_all()  # wake the writer", "                pass  # wake the writer",
      T("ledger/writer"), "the writer is not woken when a batch starts or fills"),
    m("ledger_flush_counter_leaks", "prefixgate/cache/ledger/writer.py",
      "            finally:\n                self._flushing -= 1", "            finally:\n                pass",
      T("ledger/writer"), "a flush never gives back its count: the writer stays in flush mode"),
    m("spec_allowance_never_spent", "prefixgate/local_engine/spec/decode.py",
      "                    allowance -= len(d.tokens)\n", "", SPEC_STEP,
      "a draft does not spend the step's allowance: later requests draft past the row cap"),
    m("spec_k_past_max_tokens", "prefixgate/local_engine/spec/decode.py",
      "k = min(st.k, cap, share, seq.max_tokens - seq.num_completion - 1)", "k = min(st.k, cap, share)",
      SPEC_STEP, "k drafted past max_tokens"),
    m("sched_draft_budget_not_charged", "prefixgate/local_engine/sched/scheduler.py",
      "                    self.kv.grow(s, k)\n                    budget -= k\n",
      "                    self.kv.grow(s, k)\n", SCHED_STEP,
      "a draft's tokens not charged to the step budget: the next draft overruns it"),
    m("sched_hit_kept_for_unadmitted", "prefixgate/local_engine/sched/scheduler.py",
      "self.stats.cache_hit_tokens -= seq.cached_tokens or 0", "pass", SCHED_STEP,
      "an undone admission keeps its cache-hit tokens (counted again when it runs)"),
    m("quant_qkv_bias_dropped", "prefixgate/local_engine/model/quant/int8.py",
      'mk["qkv"](w_qkv, b_qkv)', 'mk["qkv"](w_qkv, None)', QUANT, "the QKV bias dropped in int8"),
    m("tool_mask_allowed_defaults_required", "prefixgate/local_engine/server/tool_mask.py",
      'mode = spec.get("mode", "auto")', 'mode = spec.get("mode", "required")', TOOLS,
      "allowed_tools without a mode forces a call"),
    m("constrained_array_items_unbounded", "prefixgate/local_engine/server/constrained.py",
      'for key in ("items", "additionalProperties", "not"):', 'for key in ("additionalProperties", "not"):',
      TOOLS, "strings inside array items get no maxLength: the grammar repeats without bound"),
    # -- issue 36: the meaning guard's core ------------------------------------------------------
    m("guard_on_at_the_margin", "prefixgate/cache/guard/sequential.py",
      "rule.margin) < -z_on", "rule.margin) <= -z_on", T("guard/sequential"),
      "a move exactly at the margin's edge is turned on"),
    m("guard_verdict_between_looks", "prefixgate/cache/guard/sequential.py",
      "if n == 0 or (n % rule.look_every and not final):", "if n == 0:", T("guard/sequential"),
      "a verdict between looks: the alpha spent per look no longer bounds the error"),
    m("guard_no_fail_closed", "prefixgate/cache/guard/sequential.py",
      "    if final:\n        return Decision(\"off\"", "    if False:\n        return Decision(\"off\"",
      T("guard/sequential"), "a move not proven in max_pairs keeps trialling instead of failing closed"),
    m("guard_tool_args_unsorted", "prefixgate/cache/guard/decisions.py",
      "sort_keys=True", "sort_keys=False", T("guard/decisions"),
      "the same tool call with its arguments in another key order counts as changed"),
    m("guard_later_pairs_counted", "prefixgate/cache/guard/verdicts.py",
      "        if held is not None:\n            return self._note(route, tenant, held)\n        packed",
      "        packed", T("guard/verdicts"), "pairs after a verdict are counted into the next trial"),
    m("guard_key_without_tenant", "prefixgate/cache/guard/verdicts.py",
      "{quote(route, safe='')}:{quote(tenant, safe='')}:", "{quote(route, safe='')}:",
      T("guard/verdicts"), "one tenant reads another's verdicts"),
    m("guard_budget_check_then_incr", "prefixgate/cache/guard/budget.py",
      "            now = await self.shared.incr(key, amount, KEY_TTL_S)\n            held.append((key, amount))\n"
      "            if now > limit or not self._shared_up():",
      "            if await self.shared.count(key) + amount <= limit:\n"
      "                await self.shared.incr(key, amount, KEY_TTL_S)\n"
      "                held.append((key, amount))\n                continue\n            if True:",
      T("guard/budget"), "check then increment: concurrent reservations pass the limit"),
    m("guard_budget_no_rollback", "prefixgate/cache/guard/budget.py",
      "                for k, a in held:\n                    await self.shared.incr(k, -a, KEY_TTL_S)",
      "                pass", T("guard/budget"), "a refused reservation keeps what it counted"),
]
