"""Equivalent mutants of :mod:`bench.mutation_score`: mutants no test can kill because they do
not change what the module does (issue 21). Each entry, by module: the mutant's name (mutmut's,
without the module prefix) -> (the mutated line as its diff shows it, the one-line reason).
The score script checks the line against the mutant's diff, so an entry that no longer matches
(the code moved) counts as survived until it is looked at again.
"""

from __future__ import annotations

EQUIVALENT: dict[str, dict[str, tuple[str, str]]] = {
    "prefixgate/proxy/routing/breaker.py": {
        "xǁBreakerǁavailable__mutmut_1": (
            "if not self.settings.enabled and self.state == CLOSED:",
            "a disabled breaker never leaves CLOSED (no trip, no peer opening; settings are fixed per "
            "board) and a CLOSED breaker never has probing set, so both forms answer True"),
    },
}
