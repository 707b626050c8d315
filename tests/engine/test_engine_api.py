"""The Engine facade: streaming, cancellation, abort, context limits, stats, GGUF loading."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from prefixgate.local_engine.sched.api_types import PromptTooLong, SamplingParams
from tests.tiny_model import real_model_dir

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def wait_idle(eng: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = eng.stats()
        if st["num_running"] == 0 and st["num_waiting"] == 0:
            return st  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError("engine did not go idle")


async def test_generate_streams_one_output_per_token(tiny_engine: Any) -> None:
    prompt = list(range(40, 60))
    outs = [o async for o in tiny_engine.generate(prompt, GREEDY, request_id="r-1")]
    assert all(o.request_id == "r-1" for o in outs)
    assert [len(o.new_token_ids) for o in outs] == [1] * 8
    assert [o.completion_tokens for o in outs] == list(range(1, 9))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    ids = [t for o in outs for t in o.new_token_ids]
    assert ids == tiny_engine.generate_batch([prompt], GREEDY)[0]


async def test_concurrent_generate_calls(tiny_engine: Any) -> None:
    prompts = [list(range(100 + 9 * i, 120 + 9 * i)) for i in range(6)]

    async def one(p: list[int]) -> list[int]:
        return [t async for o in tiny_engine.generate(p, GREEDY) for t in o.new_token_ids]

    got = await asyncio.gather(*(one(p) for p in prompts))
    assert list(got) == [tiny_engine.generate_batch([p], GREEDY)[0] for p in prompts]


async def test_cancelling_the_iterator_aborts_and_frees_slots(make_engine: Any) -> None:
    eng = make_engine(enable_prefix_cache=False)
    params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    agen = eng.generate(list(range(10, 30)), params)
    n = 0
    async for _ in agen:
        n += 1
        if n == 3:
            break
    await agen.aclose()
    st = await asyncio.to_thread(wait_idle, eng)
    assert st["kv_slots_used"] == 0


async def test_abort_by_request_id(make_engine: Any) -> None:
    eng = make_engine()
    params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    outs = []
    async for o in eng.generate(list(range(10, 30)), params, request_id="abc"):
        outs.append(o)
        if len(outs) == 2:
            eng.abort("abc")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert len(outs) < 500
    eng.abort("no-such-request")  # ignored


def test_prompt_too_long_and_max_tokens_clipped(make_engine: Any) -> None:
    eng = make_engine(max_context_len=64)
    assert eng.max_context_len == 64
    with pytest.raises(PromptTooLong):
        eng.generate_batch([list(range(64))], GREEDY)
    with pytest.raises(ValueError):
        eng.generate_batch([[]], GREEDY)
    with pytest.raises(ValueError):
        eng.generate_batch([[10**9]], GREEDY)
    out = eng.generate_batch([list(range(60))], SamplingParams(max_tokens=100, temperature=0.0,
                                                               ignore_eos=True))[0]
    assert len(out) == 4  # clipped to the context


async def test_prompt_too_long_raises_before_streaming(make_engine: Any) -> None:
    eng = make_engine(max_context_len=32)
    with pytest.raises(PromptTooLong):
        async for _ in eng.generate(list(range(40)), GREEDY):
            pass


def test_stats_fields(tiny_engine: Any) -> None:
    tiny_engine.generate_batch([list(range(5, 25))], GREEDY)
    st = tiny_engine.stats()
    for key in ("kv_slots_used", "kv_slots_total", "cache_hit_tokens_total",
                "prompt_tokens_total", "num_running", "num_waiting", "prefill_tokens_per_s",
                "decode_tokens_per_s"):
        assert key in st
    assert st["kv_slots_total"] == 8192
    assert 0 < st["kv_slots_used"] <= st["kv_slots_total"]
    assert st["prefill_tokens_per_s"] > 0 and st["decode_tokens_per_s"] > 0


def test_kv_memory_budget_and_fp16_kv(make_engine: Any) -> None:
    eng = make_engine(num_kv_slots=None, kv_memory_gb=0.001, kv_dtype="float16")
    # 2 layers × 2 kv heads × 16 dims × 2 (K,V) × 2 bytes = 256 bytes per slot
    assert eng.stats()["kv_slots_total"] == (1 << 30) // 1000 // 256
    ref = make_engine()
    p = list(range(200, 230))
    assert len(eng.generate_batch([p], GREEDY)[0]) == 8
    assert eng.pool.k[0].dtype.itemsize == 2 and ref.pool.k[0].dtype.itemsize == 4


def test_shutdown_then_submit_fails(make_engine: Any) -> None:
    eng = make_engine()
    eng.generate_batch([list(range(5, 15))], GREEDY)
    eng.shutdown()
    with pytest.raises(RuntimeError):
        eng.generate_batch([list(range(5, 15))], GREEDY)


@pytest.mark.slow
def test_gguf_load_matches_converted_safetensors(make_engine: Any) -> None:
    d = real_model_dir()
    gguf = next(d.glob("*.gguf"), None)
    if gguf is None:
        pytest.skip("no GGUF beside the converted model")
    prompt = list(range(1000, 1016))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    a = make_engine(model_path=gguf, num_kv_slots=256, max_context_len=256)
    assert a.model_name == gguf.stem
    out = a.generate_batch([prompt], params)[0]
    b = make_engine(model_path=d, num_kv_slots=256, max_context_len=256)
    assert out == b.generate_batch([prompt], params)[0]
