"""docs/bridges.md lists every field of both APIs and what each bridge does with it, and says
what the code does: it is rendered from the tables the bridges enforce."""

from __future__ import annotations

from pathlib import Path

from prefixgate.proxy.bridges import anthropic_openai_request as a2o_request
from prefixgate.proxy.bridges import docs as bridge_docs
from prefixgate.proxy.bridges import openai_anthropic_request as o2a_request

DOC = Path(__file__).resolve().parents[2] / "docs" / "bridges.md"

# Top-level request fields of the two APIs' references (Chat Completions create; Messages create).
OPENAI_FIELDS = {
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
    "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice",
    "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options"}
ANTHROPIC_FIELDS = {
    "model", "messages", "max_tokens", "cache_control", "container", "context_management",
    "inference_geo", "mcp_servers", "metadata", "output_config", "output_format",
    "service_tier", "stop_sequences", "stream", "system", "temperature", "thinking",
    "tool_choice", "tools", "top_k", "top_p"}


def test_docs_table_is_the_rendering_of_the_bridges_field_tables() -> None:
    assert DOC.read_text(encoding="utf-8") == bridge_docs.render(), (
        "docs/bridges.md is stale: run python -m prefixgate.proxy.bridges.docs > docs/bridges.md")


def test_every_request_field_of_both_apis_has_a_row() -> None:
    assert OPENAI_FIELDS <= set(o2a_request.TOP)
    assert ANTHROPIC_FIELDS <= set(a2o_request.TOP)
