"""vLLM's kv_transfer_params on our engine: which shapes each role accepts (400s name the field),
and the prompt-tokens-by-source split."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from prefixgate.local_engine.server.pd_handoff import (
    PDHandoff,
    parse_kv_transfer_params,
    prompt_sources,
)
from prefixgate.local_engine.server.protocol import ApiError

VLLM_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}


def test_the_vllm_prefill_shape_is_a_prefill_request_on_a_prefill_instance() -> None:
    pd = parse_kv_transfer_params(VLLM_PREFILL, "prefill")
    assert pd is not None and pd.kind == "prefill"


@pytest.mark.parametrize("role", ["decode", "both"])
def test_a_prefill_request_elsewhere_is_a_400_naming_the_field(role: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_kv_transfer_params(VLLM_PREFILL, role)
    assert e.value.status == 400 and e.value.param == "kv_transfer_params"


def test_the_prefill_answer_shape_is_a_decode_request_on_a_decode_instance() -> None:
    answer = {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": 42,
              "remote_engine_id": "x", "remote_block_ids": [], "remote_host": "h", "remote_port": 1,
              "transfer_tag": "0" * 64}
    pd = parse_kv_transfer_params(answer, "decode")
    assert pd is not None and pd.kind == "decode" and pd.transfer_id == 42
    assert pd.first_token_ids == ()
    pd = parse_kv_transfer_params({**answer, "first_token_ids": [17]}, "decode")
    assert pd is not None and pd.first_token_ids == (17,)
    with pytest.raises(ApiError):
        parse_kv_transfer_params(answer, "prefill")


@pytest.mark.parametrize("bad", [
    [], "x", {"do_remote_decode": "true"}, {"do_remote_decode": True, "do_remote_prefill": True},
    {"do_remote_prefill": True, "transfer_id": "7"}, {"do_remote_prefill": True, "transfer_id": -1},
    {"do_remote_prefill": True, "transfer_id": True},
    {"do_remote_prefill": True, "first_token_ids": 5},
    {"do_remote_prefill": True, "first_token_ids": [1, -2]},
    {"do_remote_prefill": True, "first_token_ids": [True]},
    {"do_remote_prefill": True, "first_token_ids": list(range(9))},
    {"do_remote_prefill": True, "first_token_ids": [2**40], "transfer_tag": "0" * 64},
    {"do_remote_prefill": True, "transfer_id": 2**63, "transfer_tag": "0" * 64},
    {"do_remote_prefill": True, "transfer_id": 7},  # no transfer_tag: not a prefill answer
])
def test_malformed_params_are_400s(bad: object) -> None:
    with pytest.raises(ApiError) as e:
        parse_kv_transfer_params(bad, "decode")
    assert e.value.param == "kv_transfer_params"


def test_absent_or_neither_side_is_a_plain_request() -> None:
    assert parse_kv_transfer_params(None, "decode") is None
    assert parse_kv_transfer_params({"do_remote_decode": False}, "both") is None
    assert PDHandoff("both").parse({"kv_transfer_params": None}) is None


def test_prompt_sources_split_the_prompt_exactly() -> None:
    assert prompt_sources(100, 60, 40) == {"computed": 40, "local_cache_hit": 20,
                                           "external_kv_transfer": 40}
    assert prompt_sources(100, 30, 40) == {"computed": 70, "local_cache_hit": 0,
                                           "external_kv_transfer": 30}
    assert prompt_sources(10, 0, 0) == {"computed": 10, "local_cache_hit": 0,
                                        "external_kv_transfer": 0}


def test_the_handoff_counts_sources_into_its_stats() -> None:
    h = PDHandoff("both")
    h.record(50, 20, 0)
    h.record(10, 9, 9)
    s = h.stats()
    assert s["prompt_tokens_by_source:computed"] == 31
    assert s["prompt_tokens_by_source:local_cache_hit"] == 20
    assert s["prompt_tokens_by_source:external_kv_transfer"] == 9


async def test_hold_keeps_the_import_locked_until_the_outputs_end() -> None:
    released: list[object] = []

    class Role:
        def unclaim(self, pending: object) -> None:
            released.append(pending)

    hooks = PDHandoff("decode", decode_role=Role())  # type: ignore[arg-type]
    token = object()

    async def outputs() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    seen = []
    async for out in hooks.hold(token, outputs()):  # type: ignore[arg-type]
        seen.append(out)
        assert released == []  # not after the first output: the request is not admitted yet
    assert seen == [0, 1, 2] and released == [token]
    gen = hooks.hold(token, outputs())  # type: ignore[arg-type]
    await anext(gen)
    await gen.aclose()  # a client gone mid-stream
    assert released == [token, token]
