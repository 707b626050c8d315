"""The passes' defaults as the docs state them, generated from the code so they cannot drift
(issue 37, item 8: ``docs/passes.md`` said ``hoist_volatile`` and ``stabilise_passages`` were on
while the schema and the shipped policy have them off).

``python -m prefixgate.rewriter.defaults_doc`` prints the table that ``docs/passes.md`` holds
between ``<!-- generated: pass defaults -->`` and ``<!-- end generated -->``: each pass in
pipeline order (:data:`prefixgate.rewriter.pipeline.PASSES`), its ``rewrite.<switch>`` and its
default from :class:`prefixgate.config.schema.RewriteSettings` (``guarded`` for the moves,
:data:`prefixgate.config.guard_settings.MOVES`: on for a route only after a bounded trial on its
own backend shows answers keep; ``off: opt-in`` for a move of
:data:`prefixgate.config.schema.MOVES_THE_MODEL_READS` shipped off). :func:`default_word` is the word every
doc uses after a pass's name; ``tests/test_docs_defaults.py`` checks the block and every such
mention in the README and ``docs/``.
"""

from __future__ import annotations

from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings, switch_on
from prefixgate.rewriter.pipeline import PASSES

BEGIN = "<!-- generated: pass defaults (python -m prefixgate.rewriter.defaults_doc) -->"
END = "<!-- end generated -->"


def default_word(switch: str) -> str:
    """``on``, ``guarded`` (a move, on per route once trialled), ``off`` or ``off: opt-in`` (a
    move of what the model reads) for a pass switch. Raises AttributeError for a name that is
    no ``RewriteSettings`` switch."""
    defaults = RewriteSettings()
    if getattr(defaults, switch) == "guarded":
        return "guarded"
    if switch_on(defaults, switch):
        return "on"
    return "off: opt-in" if switch in MOVES_THE_MODEL_READS else "off"


def table() -> str:
    """The generated block: markers, then one row per pass in pipeline order."""
    rows = [f"| {i} | `{p.name}` | `rewrite.{p.switch}` | {default_word(p.switch)} |"
            for i, p in enumerate(PASSES, 1)]
    return "\n".join([BEGIN, "| order | pass | policy switch | default |", "|---|---|---|---|",
                      *rows, END])


if __name__ == "__main__":
    print(table())
