"""Equivalent mutants of :mod:`bench.mutation_score`: mutants no test can kill because they do
not change what the module does (issue 21). Each entry, by module: the mutant's name (mutmut's,
without the module prefix) -> (the mutated line as its diff shows it, the one-line reason).
The score script checks the line against the mutant's diff, so an entry that no longer matches
(the code moved) counts as survived until it is looked at again.
"""

from __future__ import annotations

UNREACHABLE_FALLBACK = ("unreachable: with session_balance >= 1, the group's live keys number total - 1 < "
                        "n * cap, so some deployment is under the cap and the generator never runs out")

EQUIVALENT: dict[str, dict[str, tuple[str, str]]] = {
    "prefixgate/proxy/routing/breaker.py": {
        "xǁBreakerǁavailable__mutmut_1": (
            "if not self.settings.enabled and self.state == CLOSED:",
            "a disabled breaker never leaves CLOSED (no trip, no peer opening; settings are fixed per "
            "board) and a CLOSED breaker never has probing set, so both forms answer True"),
    },
    "prefixgate/proxy/routing/balance.py": {
        "x_rendezvous__mutmut_3": (
            'scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:9] for n in names]',
            "comparing 9 bytes instead of 8 changes the order only when two 64-bit prefixes collide "
            "(probability 2^-64 per pair)"),
        "x_rendezvous_order__mutmut_3": (
            'scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:9] for n in names]',
            "as x_rendezvous__mutmut_3: a 2^-64 collision of the 8-byte prefixes"),
        "xǁBalancerǁ_forget__mutmut_5": (
            "self._keys.popitem(last=None)",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁBalancerǁ_keep__mutmut_7": (
            "old, _ = self._keys.popitem(last=None)[1]",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁBalancerǁacquire__mutmut_10": (
            "done = None",
            "`done` is only read as `not done`: None and False are both falsy"),
        "xǁBalancerǁplace__mutmut_39": (
            "pick = next((i for i in order if self._live[names[i]] < cap), None)", UNREACHABLE_FALLBACK),
        "xǁBalancerǁplace__mutmut_41": (
            "pick = next((i for i in order if self._live[names[i]] < cap), )", UNREACHABLE_FALLBACK),
        "xǁBalancerǁplace__mutmut_43": (
            "pick = next((i for i in order if self._live[names[i]] < cap), order[1])", UNREACHABLE_FALLBACK),
    },
    "prefixgate/proxy/routing/retries.py": {
        "xǁSenderǁorder__mutmut_37": (
            'placed = ""',
            "placed is replaced in prefix / exact mode and never read by choose in round_robin / "
            "least_load (they return first)"),
        "xǁSenderǁorder__mutmut_74": (
            "key=lambda i: (loads[i], rendezvous(None, [names[i]])))",
            "rendezvous over a one-name list is always 0, whatever the key: the tie-break is the "
            "group's order either way (a no-op in the original too, reported)"),
        "xǁSenderǁrun__mutmut_30": (
            "sent, paid = 0, True  # paid: the next send's budget token is already taken",
            "`paid` is read only when `sent` is non-zero, and the first send resets it to False"),
        "xǁSenderǁrun__mutmut_55": (
            "sent, paid = sent - 1, False",
            "`sent` is read only for its truth: -1, -2, ... are as non-zero as 1, 2, ..."),
        "xǁSenderǁrun__mutmut_56": (
            "sent, paid = sent + 2, False",
            "`sent` is read only for its truth: 2, 4, ... are as non-zero as 1, 2, ..."),
        "xǁSenderǁrun__mutmut_180": (
            "go_on = None",
            "`go_on` is read only as `not go_on`: None and False are both falsy"),
    },
}
