"""Policy settings of the local engines ``prefixgate serve`` spawns (``engine:``).

    engine:
      span_reuse: on        # off: a prefix match only (the engine's --span-reuse off)

``span_reuse`` (issue 33): when a prompt's prefix match stops at a short changed span — a clock,
a request id — and the cached continuation re-aligns after it, the engine reuses the KV after
the span and prefills only the span and the new tail. Nothing the model reads is moved, so with
it on the proxy's moves (``rewrite.hoist_volatile``, ``rewrite.stabilise_passages``,
:data:`prefixgate.config.schema.MOVES_THE_MODEL_READS`) need not run for local routes (they ship
``guarded``: off until a trial shows the route's answers keep): the engine gets the reuse they
bought without changing a byte. Measured against a full recompute
(greedy equality, teacher-forced KL, the clock-tick floor) by ``bench/span_reuse.py``
(``bench/results/span_reuse.json``). Passed to each spawned engine as ``--span-reuse on|off``;
an engine started elsewhere keeps its own flag.

YAML 1.1 reads ``on`` / ``off`` as booleans (PyYAML does): both spellings are taken, and so are
the strings ``"on"`` / ``"off"``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

_WORDS = {"on": True, "off": False, "true": True, "false": False}


class EngineSettings(BaseModel):
    """Settings of the spawned local engines (module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    span_reuse: bool = True
    """Reuse the KV after a short changed span (a clock, an id) instead of recomputing the rest
    of the prompt (issue 33; ``bench/results/span_reuse.json``); ``off``: prefix matches only."""

    @field_validator("span_reuse", mode="before")
    @classmethod
    def _on_off(cls, v: Any) -> Any:
        if isinstance(v, str):
            word = _WORDS.get(v.strip().lower())
            if word is None:
                raise ValueError("span_reuse must be on or off")
            return word
        if not isinstance(v, bool):
            raise ValueError("span_reuse must be on or off")
        return v

    def engine_flags(self) -> list[str]:
        """The engine command-line flags these settings give (``--span-reuse on|off``)."""
        return ["--span-reuse", "on" if self.span_reuse else "off"]
