"""Metrics rendering and SGLang-style status line, from a stats dict (no engine)."""

from __future__ import annotations

from prefixgate.local_engine.server.metrics import EngineMetrics, stats_log_line

STATS = {"kv_slots_used": 250, "kv_slots_total": 1000, "kv_slots_cached": 200,
         "num_running": 2, "num_waiting": 1, "cache_hit_tokens_total": 300,
         "prompt_tokens_total": 400, "prefill_tokens_per_s": 812.04,
         "decode_tokens_per_s": 21.46}


def test_status_line_carries_sglang_fields() -> None:
    line = stats_log_line(STATS)
    assert line == ("#running-req: 2, #queue-req: 1, #token: 250, token usage: 0.25, "
                    "cache hit rate: 0.75, prefill throughput (token/s): 812.0, "
                    "gen throughput (token/s): 21.5")


def test_scrape_reads_stats_each_time_and_histograms_count_requests() -> None:
    stats = dict(STATS)
    m = EngineMetrics(lambda: stats)
    m.observe_request(ttft_s=0.2, tpot_s=0.05, e2e_s=1.0, completion_tokens=17,
                      finish_reason="stop")
    m.observe_request(ttft_s=None, tpot_s=None, e2e_s=0.1, completion_tokens=0,
                      finish_reason="abort")
    text = m.render().decode()
    assert "engine_kv_pool_usage_ratio 0.25" in text
    assert "engine_num_waiting_requests 1.0" in text
    assert "engine_time_to_first_token_seconds_count 1.0" in text
    assert 'engine_requests_total{finish_reason="abort"} 1.0' in text
    assert "engine_generation_tokens_total 17.0" in text
    stats["num_running"] = 0
    assert "engine_num_running_requests 0.0" in m.render().decode()
