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
}

# --- prefixgate/cache/guard/verdicts.py --------------------------------------------------------

GUARD["prefixgate/cache/guard/verdicts.py"] = {
    "x__key__mutmut_5": (
        "return f\"guard:{kind}:{quote(route, safe='XXXX')}:{quote(tenant, safe='')}:{quote(move, safe='')}\"",
        "safe='XXXX' adds only 'X', an ASCII letter quote never escapes: every name quoted as with safe=''"),
    "x__key__mutmut_10": (
        "return f\"guard:{kind}:{quote(route, safe='')}:{quote(tenant, safe='XXXX')}:{quote(move, safe='')}\"",
        "safe='XXXX' adds only 'X', an ASCII letter quote never escapes: every name quoted as with safe=''"),
    "x__key__mutmut_15": (
        "return f\"guard:{kind}:{quote(route, safe='')}:{quote(tenant, safe='')}:{quote(move, safe='XXXX')}\"",
        "safe='XXXX' adds only 'X', an ASCII letter quote never escapes: every name quoted as with safe=''"),
    "xǁGuardBookǁ_note__mutmut_5": (
        "self._seen.popitem(last=None)",
        "OrderedDict.popitem takes last by truth value: None is false, so it pops the oldest as last=False does"),
}

# --- prefixgate/cache/guard/budget.py ----------------------------------------------------------

GUARD["prefixgate/cache/guard/budget.py"] = {
}
