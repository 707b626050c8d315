"""Guarded moves resolved for one request, before the passes run (issue 36, the meaning guard).

A move (:data:`prefixgate.config.guard_settings.MOVES`) whose mode is ``guarded`` is on for this
request only when the meaning guard's verdict for the request's route and tenant is ``on`` (a
bounded trial on the route's own backend showed its changed-answer rate within the floor's
margin); ``trialling``, ``off``, no verdict, the verdicts unreadable or the guard disabled: off
(fail closed: a move that is not proven does not run). Moves set ``on`` or ``off`` are never
looked up. The rewriter itself never sees ``guarded``: :func:`resolve_moves` hands the passes
settings where every move is ``on`` or ``off``.

What was decided is said twice, without prompt text: an Edit of :data:`GUARD_EDIT` (not applied;
``hoist_volatile: trialling (12 pairs); prune_tools: on (40 pairs, 0.00 vs floor 0.00)``) and the
response header :data:`GUARD_HEADER` (``hoist_volatile=trialling (12 pairs); ...``).

The verdicts come from an object with the one method of :class:`GuardBookLike`
(``prefixgate.cache.guard.verdicts.GuardBook``), so this module depends on its shape only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from prefixgate.config.guard_settings import guarded_moves
from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.types import Edit

log = logging.getLogger("prefixgate.proxy")

GUARD_EDIT = "meaning_guard"
GUARD_HEADER = "x-prefixgate-guard"
DISABLED = "off (guard disabled)"
"""What a guarded move says when the guard is off (``meaning_guard.enabled: false``, or no
guard in this process)."""
UNAVAILABLE = "off (verdicts unavailable)"
"""... when reading the verdicts failed (shared state down): off, the request goes on."""
NO_VERDICT = "off (no verdict)"
"""... when the book returned nothing for the move."""
MAX_WORDS_CHARS = 120
"""Longest text one move's verdict may put in the Edit and the header."""
_UNSAFE = re.compile(r"[^\x20-\x7e]")


class VerdictLike(Protocol):
    """What :func:`resolve_moves` reads of a verdict (``MoveVerdict``)."""

    @property
    def state(self) -> str:
        """``trialling``, ``on`` or ``off``."""
        ...

    def header(self) -> str:
        """e.g. ``trialling (12 pairs)``, ``on (40 pairs, 0.00 vs floor 0.00)``."""
        ...


class GuardBookLike(Protocol):
    """The one method of the guard's book :func:`resolve_moves` calls (``GuardBook.verdicts``)."""

    async def verdicts(self, route: str, tenant: str,
                       moves: Sequence[str]) -> Mapping[str, VerdictLike]:
        """The (route, tenant)'s verdict of each of ``moves``."""
        ...


def _words(text: str) -> str:
    """``text`` safe for a header and bounded: printable ASCII, at most
    :data:`MAX_WORDS_CHARS` characters."""
    return _UNSAFE.sub("?", text)[:MAX_WORDS_CHARS]


async def _read(book: GuardBookLike | None, route: str, tenant: str,
                moves: list[str]) -> tuple[dict[str, str], set[str]]:
    """``({move: what its verdict says}, the moves whose verdict is on)``; never raises."""
    if book is None:
        return {m: DISABLED for m in moves}, set()
    try:
        got = await book.verdicts(route, tenant, moves)
    except Exception:  # noqa: BLE001 - a guard failure must not fail the request: moves off
        log.exception("meaning guard: reading the verdicts failed; guarded moves off")
        return {m: UNAVAILABLE for m in moves}, set()
    words, on = {}, set()
    for m in moves:
        v = got.get(m)
        if v is None:
            words[m] = NO_VERDICT
            continue
        try:
            words[m] = _words(v.header())
            if v.state == "on":
                on.add(m)
        except Exception:  # noqa: BLE001 - a malformed verdict: the move stays off
            log.exception("meaning guard: unreadable verdict of %s", m)
            words[m] = NO_VERDICT
    return words, on


async def resolve_moves(settings: RewriteSettings, book: GuardBookLike | None, route: str,
                        tenant: str) -> tuple[RewriteSettings, Edit | None, str | None]:
    """``settings`` with every ``guarded`` move set ``on`` (its verdict for ``route`` and
    ``tenant`` is ``on``) or ``off`` (anything else; ``book`` None: the guard is disabled), the
    Edit saying so and the :data:`GUARD_HEADER` value; ``(settings, None, None)`` when no move
    is guarded (the book is not asked). Only the guarded moves are asked for, in one call.
    Never raises for the book (module docstring)."""
    moves = guarded_moves(settings)
    if not moves:
        return settings, None, None
    words, on = await _read(book, route, tenant, moves)
    resolved = settings.model_copy(update={m: "on" if m in on else "off" for m in moves})
    edit = Edit(GUARD_EDIT, False, "all", "; ".join(f"{m}: {words[m]}" for m in moves))
    return resolved, edit, "; ".join(f"{m}={words[m]}" for m in moves)
