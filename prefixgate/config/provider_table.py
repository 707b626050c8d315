"""What prefixgate does by default for each kind of backend, and what it measures there: one
table generated from the code (issue 35, item 4), so it cannot drift.

``python -m prefixgate.config.provider_table --page > docs/providers.md`` writes the page (linked
from the README's reference list); ``tests/config/test_provider_table.py`` checks it is current.

Each row is one backend kind (:data:`prefixgate.config.backend_kinds.BACKEND_KINDS`); each cell is
computed from that kind's traits, the shipped :class:`prefixgate.config.schema.RewriteSettings`
defaults and the cache rules (:mod:`prefixgate.config.cache_rules`):

* **on by default** — what prefixgate adds that the model never reads: Anthropic
  ``cache_control`` breakpoints (``place_breakpoints``), OpenAI
  ``prompt_cache_key`` per conversation (``openai_prompt_cache_key`` and the kind's
  ``prompt_cache_key`` trait), a tenant's ``cache_salt`` (``default_cache_salt``), llama.cpp slot
  pinning (``pins_slots``), prefix-affinity routing (radix backends); and a session's later tool
  lists in its first request's form (``canonicalize_tools``);
* **guarded** — the passes that move or remove text the model reads
  (:data:`prefixgate.config.guard_settings.MOVES`) whose mode is ``guarded``: on for a route only
  after a bounded trial on that route's own backend shows its changed-answer rate within the
  floor's margin (:mod:`prefixgate.config.guard_settings`);
* **opt-in** — those of them set ``off``, and the cache-diagnostics request
  (``cache_diagnostics``);
* **measured** — what the proxy reads off each answer (:mod:`prefixgate.proxy.core.usage`,
  :mod:`prefixgate.proxy.core.diagnostics`) per cache provider.
"""

from __future__ import annotations

from prefixgate.config.backend_kinds import BACKEND_KINDS, KindTraits
from prefixgate.config.cache_rules import OPENAI_MIN_PROMPT_TOKENS
from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings

PRUNING = ("prune_tools", "prune_rag", "prune_history")
MASKING = "(tool pruning masks calls instead of removing tools)"

MEASURED: dict[str, str] = {
    "openai": "`prompt_tokens_details.cached_tokens` (Responses `input_tokens_details`); "
              "`prompt_cache_diagnostics` (type, reason, missed / reusable tokens) when present",
    "anthropic": "`cache_read_input_tokens`, `cache_creation_input_tokens`; "
                 "`diagnostics.cache_miss_reason` (type, missed tokens; `pending`) when present",
    "radix": "cached tokens (`prompt_tokens_details.cached_tokens`)",
}
"""What the proxy reads per cache provider (module docstring)."""


def _does(name: str, t: KindTraits, s: RewriteSettings) -> str:
    out = []
    if t.cache_provider == "anthropic" and s.place_breakpoints:
        out.append("`cache_control` breakpoints (at most 4 with the client's; never on a "
                   "trailing system message)")
    if t.prompt_cache_key and s.openai_prompt_cache_key:
        out.append(f"`prompt_cache_key` per conversation (prompts of {OPENAI_MIN_PROMPT_TOKENS}+ "
                   "tokens; the client's kept)")
    if t.default_cache_salt:
        out.append("the tenant's `cache_salt`")
    if t.pins_slots:
        out.append("conversation pinned to a slot (`id_slot`)")
    if t.cache_provider == "radix":
        out.append("prefix-affinity routing across deployments")
    if s.canonicalize_tools:
        out.append("a session's later tool lists in the order and key order of its first "
                   "(the tools the model read on that request)")
    return "; ".join(out)


def _measured(t: KindTraits) -> str:
    out = MEASURED[t.cache_provider]
    if t.pins_slots:
        out += "; llama.cpp `timings` (`cache_n`, `prompt_ms`: prefill)"
    if t.spawnable:
        out += "; `X-Engine-*` headers (cached tokens, queue / prefill / decode ms)"
    return out


def _moves(t: KindTraits, s: RewriteSettings, mode: str) -> list[str]:
    """The moves whose mode in ``s`` is ``mode``."""
    return [f"`{n}`" for n in (*MOVES_THE_MODEL_READS, *PRUNING) if getattr(s, n) == mode]


def _masking(t: KindTraits, s: RewriteSettings, mode: str) -> list[str]:
    """The kind's tool-pruning note, in the cell that lists ``prune_tools``."""
    return [MASKING] if t.masks_tools and s.prune_tools == mode else []


def _guarded(t: KindTraits, s: RewriteSettings) -> str:
    return ", ".join(_moves(t, s, "guarded") + _masking(t, s, "guarded"))


def _opt_in(t: KindTraits, s: RewriteSettings) -> str:
    off = _moves(t, s, "off")
    if t.cache_provider in ("anthropic", "openai") and not s.cache_diagnostics:
        off.append("`cache_diagnostics`" + (" (Responses API)" if t.cache_provider == "openai"
                                            else ""))
    return ", ".join(off + _masking(t, s, "off"))


def table(settings: RewriteSettings | None = None) -> str:
    """The markdown table (module docstring) for ``settings`` (the shipped defaults)."""
    s = settings or RewriteSettings()
    lines = ["| backend kind | speaks | cache | on by default | guarded | opt-in | measured |",
             "|---|---|---|---|---|---|---|"]
    for name, t in BACKEND_KINDS.items():
        lines.append(f"| `{name}` | {t.wire} | {t.cache_provider} | {_does(name, t, s)} | "
                     f"{_guarded(t, s)} | {_opt_in(t, s)} | {_measured(t)} |")
    return "\n".join(lines) + "\n"


def page() -> str:
    """The whole of ``docs/providers.md``."""
    return ("# What prefixgate does by default, per backend\n\n"
            "Generated from the code (`python -m prefixgate.config.provider_table --page > "
            "docs/providers.md`; `prefixgate/config/provider_table.py`). What is on by default "
            "is request metadata, a cache marker or routing, which the model never reads, and "
            "the tool list of a session's first request kept for its later ones; what moves or "
            "removes text the model reads is `guarded`: on for a route only after a bounded "
            "trial on that route's own backend shows its changed-answer rate within the "
            "floor's margin (the original against its own repeat; `meaning_guard:` in "
            "`docs/policy.md`, DESIGN.md \"Meaning at the model level\"), `off` (opt-in) or "
            "`on` where the policy says so. Mid-conversation system messages and "
            "tool-change blocks stay where the client put them on every path "
            "(`prefixgate/rewriter/wire/forms.py`).\n\n" + table())


if __name__ == "__main__":
    import sys

    print(page() if "--page" in sys.argv else table(), end="")
