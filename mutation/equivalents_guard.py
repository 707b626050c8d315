"""Equivalent mutants of the meaning guard (``prefixgate/cache/guard/``, issue 36), by module:
the mutant's name -> (the mutated line as its diff shows it, the one-line reason)
(:mod:`mutation.equivalents` holds the shape and the rest)."""

from __future__ import annotations

GUARD: dict[str, dict[str, tuple[str, str]]] = {}

# --- prefixgate/cache/guard/sequential.py ------------------------------------------------------

BISECT_NOISE = ("not strictly equivalent, recorded as untestable: the bracket still holds the same root, so the "
                "bound moves only by float noise (measured below 1e-12 over n <= 200 at z <= 3.09, up to 1e-9 at z = 5 "
                "where the restricted MLE has its square-root kink); decide's verdicts read neither bound")

GUARD["prefixgate/cache/guard/sequential.py"] = {
    "x__discordant__mutmut_9": ("if min(c.both_changed, move_only, floor_only) < 0 or \\",
                                "with pairs < 0 and the other three >= 0 their sum >= 0 > pairs: the second "
                                "clause raises the same ValueError"),
    "x_decide__mutmut_82": ("upper, lower = score_bound(n, b, f, z_on, True), score_bound(n, b, f, z_off, None)",
                            "score_bound reads upper only for its truth (-z if upper else z): None is False"),
    "x_score_bound__mutmut_8": ("lo, hi = -1.0, 2.0",
                                "for delta0 in (1, 2) b_ >= 2 (n - b) >= 0 and c_ >= 0 make p_c <= 0, so var < 0 "
                                "with num < 0: T = -inf, below either target, and mids there only lower hi; "
                                + BISECT_NOISE),
    "x_score_bound__mutmut_22": ("if tango_statistic(n, b, c, mid) >= target:",
                                 "a tie T(mid) == target makes mid the root: keeping it as lo or as hi both bracket "
                                 "it; " + BISECT_NOISE),
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
