"""Policy settings of the meaning guard (issue 36): the move modes and ``meaning_guard:``.

The moves (:data:`MOVES`) are the rewrite passes that move or remove text the model reads. Each
takes a :data:`MoveMode`::

    rewrite:
      hoist_volatile: guarded    # off | on | guarded (the shipped default of all five)
    meaning_guard:
      enabled: true
      margin: 0.15
      local_budget: {requests_per_day: 1200, tokens_per_day: 3000000, usd_per_day: 0.0}
      hosted_budget: {requests_per_day: 0, tokens_per_day: 0, usd_per_day: 0.0}
    routes:
      - {match: "gpt-*", backend: openai, meaning_guard_budget: {requests_per_day: 50,
         tokens_per_day: 200000, usd_per_day: 0.5}}

``guarded``: the move is on for a route (and tenant) only once a bounded trial on that route's
own backend has shown that its changed-answer rate is within ``margin`` of the backend's own
floor (the original against its own repeat); until then, and when the trial shows it is worse,
it is off (DESIGN.md, "Meaning at the model level"). A ``guarded`` move is resolved by the proxy
before the passes run (:mod:`prefixgate.proxy.pipeline.guard_moves`); anything that runs the
passes without the proxy's verdicts (``prefixgate rewrite``, the benchmarks) treats it as off
(:func:`prefixgate.config.schema.switch_on`).

YAML 1.1 reads ``on`` / ``off`` / ``true`` / ``false`` as booleans (PyYAML does): a bool is
taken (True -> ``on``, False -> ``off``), so every policy written before the modes keeps its
meaning.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MoveMode = Literal["off", "on", "guarded"]
"""How a move runs: ``off``, ``on`` (every request), ``guarded`` (on per route once a trial
shows answers keep; module docstring)."""

MOVES: tuple[str, ...] = ("hoist_volatile", "stabilise_passages", "prune_tools",
                          "prune_history", "prune_rag")
"""The passes the meaning guard judges: each is both a pass name and its ``RewriteSettings``
switch."""


def guarded_moves(settings: Any) -> list[str]:
    """The moves whose mode in ``settings`` (a ``RewriteSettings``) is ``guarded``, in
    :data:`MOVES` order."""
    return [m for m in MOVES if getattr(settings, m, None) == "guarded"]

MOVE_MODES: tuple[str, ...] = ("off", "on", "guarded")


def move_mode(value: Any) -> Any:
    """A bool as its mode (True -> ``"on"``, False -> ``"off"``; YAML's ``on`` / ``off`` arrive
    as bools); a string casefolded and stripped; anything else as given, for the ``Literal``
    check to refuse with the field's name."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value.strip().lower()
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TrialBudget(_Strict):
    """What a route's trials may spend per UTC day. A trial whose requests, tokens or USD would
    pass a limit does not run. ``requests_per_day: 0``: no trials at all; ``usd_per_day``: 0 =
    no USD limit on a route without a price (a local or self-hosted engine), no trials on a
    priced (hosted) one."""

    requests_per_day: int = Field(0, ge=0)
    tokens_per_day: int = Field(0, ge=0)
    usd_per_day: float = Field(0.0, ge=0)


def _local_budget() -> TrialBudget:
    return TrialBudget(requests_per_day=1200, tokens_per_day=3_000_000, usd_per_day=0.0)


MAX_PAIRS_LIMIT = 32766
"""Largest ``max_pairs``: a trial's counts are packed 16 bits each into one shared counter
(:mod:`prefixgate.cache.guard.verdicts`, which refuses more)."""


class GuardSettings(_Strict):
    """The meaning guard (issue 36; policy key ``meaning_guard:``): per route and tenant, a move
    whose mode is ``guarded`` is trialled on sampled live requests in the background (the
    client's body with and without the move, and the original again for the backend's own
    floor, sent non-streamed at temperature 0 to the route's primary backend; nothing from a
    trial reaches a client) and turned on once a sequential test shows its changed-answer rate
    is not worse than the floor's by more than ``margin`` at ``confidence``; off when it is, or
    when ``max_pairs`` pairs decide nothing. ``enabled: false``: every ``guarded`` move is off."""

    enabled: bool = True
    margin: float = Field(0.15, gt=0.0, lt=1.0)
    """Changed-answer rate over the floor's tolerated (strictly between 0 and 1)."""
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    """One-sided confidence of a verdict, over all looks of a trial."""
    look_every: int = Field(20, ge=1)
    """Pairs between two looks of the sequential test (at most ``max_pairs``)."""
    max_pairs: int = Field(200, ge=1, le=MAX_PAIRS_LIMIT)
    """Pairs after which an undecided move is off (not proven)."""
    verdict_ttl_s: float = Field(86400.0, gt=0)
    """Seconds a verdict holds; then the move is trialled again (models change behind a route)."""
    sample_every: int = Field(1, ge=1)
    """Trial at most one request in this many among those the move changes."""
    max_tokens: int = Field(16, ge=1, le=4096)
    """Output cap of every trial send (tokens)."""
    first_tokens: int = Field(16, ge=1)
    """Answer texts are compared on their first this many whitespace tokens."""
    concurrency: int = Field(1, ge=1, le=64)
    """Trials running at once in one proxy process."""
    local_budget: TrialBudget = Field(default_factory=_local_budget)
    """Per-day budget of a route whose backend has no price (the local engine, a self-hosted
    OpenAI-compatible engine): trials cost engine time, run at background priority."""
    hosted_budget: TrialBudget = Field(default_factory=TrialBudget)
    """Per-day budget of a priced (hosted) route: none until set (``prefixgate report --guard``
    says what the moves would save there and what a trial would cost). A route's own
    ``routes[].meaning_guard_budget`` overrides either."""

    @model_validator(mode="after")
    def _looks_fit(self) -> GuardSettings:
        """The sequential test needs a look within ``max_pairs``
        (:class:`prefixgate.cache.guard.sequential.TestRule`): refused here, with the policy,
        rather than when the proxy starts."""
        if self.look_every > self.max_pairs:
            raise ValueError(f"look_every ({self.look_every}) must be <= max_pairs "
                             f"({self.max_pairs})")
        return self
