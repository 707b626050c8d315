"""Equivalent mutants of the meaning guard (``prefixgate/cache/guard/``, issue 36), by module:
the mutant's name -> (the mutated line as its diff shows it, the one-line reason)
(:mod:`mutation.equivalents` holds the shape and the rest)."""

from __future__ import annotations

GUARD: dict[str, dict[str, tuple[str, str]]] = {}

# --- prefixgate/cache/guard/sequential.py ------------------------------------------------------

GUARD["prefixgate/cache/guard/sequential.py"] = {
}

# --- prefixgate/cache/guard/decisions.py -------------------------------------------------------

GUARD["prefixgate/cache/guard/decisions.py"] = {
    "x_canonical_json__mutmut_4": (
        'return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=None)',
        "json reads ensure_ascii only for its truth (dumps' fast-path test, JSONEncoder's two "
        "`if self.ensure_ascii`): None is False"),
}

# --- prefixgate/cache/guard/verdicts.py --------------------------------------------------------

GUARD["prefixgate/cache/guard/verdicts.py"] = {
}

# --- prefixgate/cache/guard/budget.py ----------------------------------------------------------

GUARD["prefixgate/cache/guard/budget.py"] = {
    "xǁBudgetBookǁ_key__mutmut_5": (
        "return f\"guard:b:{quote(route, safe='XXXX')}:{day}:{field}\"",
        "quote never escapes a letter: safe='XXXX' escapes exactly what safe='' does"),
    "xǁBudgetBookǁ_shared_up__mutmut_14": (
        'return link is None or bool(getattr(link, "up", None))',
        "the only SharedState with a link is RedisState (app.py: RedisState(link) or LocalState()), "
        "whose RedisLink sets up in __init__: getattr's default is never read"),
    "xǁBudgetBookǁ_shared_up__mutmut_17": (
        'return link is None or bool(getattr(link, "up", ))',
        "the only SharedState with a link is RedisState (app.py: RedisState(link) or LocalState()), "
        "whose RedisLink sets up in __init__: getattr's default is never read (no AttributeError)"),
    "xǁBudgetBookǁ_shared_up__mutmut_20": (
        'return link is None or bool(getattr(link, "up", False))',
        "the only SharedState with a link is RedisState (app.py: RedisState(link) or LocalState()), "
        "whose RedisLink sets up in __init__: getattr's default is never read"),
}
