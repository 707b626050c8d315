"""Policy settings of a P/D-disaggregated backend (``backends.<name>.pd``).

    backends:
      fleet:
        kind: openai_compat
        base_url: http://decode:8000/v1          # the decode side (colocated requests go here)
        pd: {prefill: http://prefill:8000/v1, decode: http://decode:8000/v1, protocol: vllm,
             split_min_uncached_tokens: 512, colocate_min_cached_fraction: 0.7}

``protocol``: ``vllm`` (prefill request with ``kv_transfer_params``, its answer's params into the
decode request), ``sglang`` (the same body to both at once with ``bootstrap_host`` /
``bootstrap_port`` / ``bootstrap_room``), ``llmd`` (the decode pod's sidecar prefills on the pod
named in ``x-prefiller-host-port``). The split decision (``proxy/routing/pd/split.py``)
colocates — sends the request to ``decode`` alone, which prefills it itself — when the uncached
part is under ``split_min_uncached_tokens`` or the decode side's prefix hit covers at least
``colocate_min_cached_fraction`` of the prompt.

Defaults: Dynamo prefills on the decode worker when the uncached input is under 2,048 tokens and
under 70 % of the prompt (0.7 is its figure); llm-d's sample splits at 16 uncached tokens. 512 is
one prefill chunk of our engine (``--chunk-size``): below it a colocated chunked prefill stalls
the running decodes for at most one step, which a split cannot beat by more than its own
orchestration cost (measured in ``bench/results/pd_split.json``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefixgate.config.routing import check_base_url

PDProtocol = Literal["vllm", "sglang", "llmd"]


class PDSettings(BaseModel):
    """One prefill + one decode endpoint and when to split between them (module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    prefill: str
    """Base URL of the prefill instance (``http://host:port/v1``)."""
    decode: str
    """Base URL of the decode instance."""
    protocol: PDProtocol = "vllm"
    """Which P/D contract the pair speaks."""
    bootstrap_port: int = Field(8998, ge=1, le=65535)
    """SGLang: the prefill server's bootstrap port (its ``--disaggregation-bootstrap-port``)."""
    split_min_uncached_tokens: int = Field(512, ge=0)
    """Colocate when fewer prompt tokens than this are uncached on the decode side."""
    colocate_min_cached_fraction: float = Field(0.7, ge=0.0, le=1.0)
    """Colocate when the decode side's prefix hit covers at least this share of the prompt."""
    cache_match: bool = True
    """Ask the decode side's ``/v1/cache/match`` (our engine) for its prefix hit; off for
    engines without it (the hit is then taken as 0)."""
    timeout_s: float = Field(600.0, gt=0)
    """Seconds between two reads from either side."""

    @field_validator("prefill", "decode")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_base_url(v)
