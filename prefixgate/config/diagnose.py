"""Every problem of a policy file in one pass, for ``prefixgate config check``.

:func:`diagnose` reads a policy file and returns its problems (the file cannot be used) and its
warnings (it can, but something will fail later), each as ``(yaml path, message)``:

- YAML syntax errors, with the file's name and the line / column (not ``<unicode string>``);
- every schema error pydantic finds, a mistyped key with "did you mean 'x'?" (the closest
  known key of that section, :func:`difflib.get_close_matches`);
- every route naming an unknown backend, each with its path (``routes[2].backend``) — the
  schema's own check stops at the first;
- warnings: a backend ``api_key`` whose ``${ENV}`` variable is unset in this environment.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from prefixgate.config.schema import (
    AuthSettings,
    Backend,
    LedgerSettings,
    Limits,
    Listen,
    Policy,
    ProxyKey,
    RewriteSettings,
    Route,
)

Problem = tuple[str, str]

# The model of each section, by the yaml path's shape with indices and map keys elided.
_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Policy, ("listen",): Listen, ("backends", "*"): Backend, ("routes", "#"): Route,
    ("rewrite",): RewriteSettings, ("ledger",): LedgerSettings, ("limits",): Limits,
    ("auth",): AuthSettings, ("auth", "keys", "#"): ProxyKey,
}


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _shape(loc: tuple[Any, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out.append("#")
        elif i > 0 and loc[i - 1] == "backends":
            out.append("*")
        else:
            out.append(str(part))
    return tuple(out)


def did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _schema_problems(data: dict[str, Any]) -> list[Problem]:
    try:
        Policy.model_validate(data)
        return []
    except ValidationError as e:
        errors = e.errors()
    out: list[Problem] = []
    for err in errors:
        loc = tuple(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and loc:
            model = _SECTIONS.get(_shape(loc[:-1]))
            if model is not None:
                msg = f"unknown key{did_you_mean(str(loc[-1]), list(model.model_fields))}"
        if not loc and "routes[" in msg:
            continue  # the schema's first unknown-backend route: reported with the others below
        out.append((_path(loc), msg))
    return out


def _route_problems(data: dict[str, Any]) -> list[Problem]:
    backends = data.get("backends")
    names = sorted(backends) if isinstance(backends, dict) else []
    routes = data.get("routes")
    out: list[Problem] = []
    for i, r in enumerate(routes if isinstance(routes, list) else []):
        name = r.get("backend") if isinstance(r, dict) else None
        if isinstance(name, str) and name not in names:
            out.append((f"routes[{i}].backend", f"unknown backend {name!r}"
                        f"{did_you_mean(name, names)}; the backends are {names}"))
    return out


def _env_warnings(data: dict[str, Any]) -> list[Problem]:
    backends = data.get("backends")
    out: list[Problem] = []
    for name, b in (backends.items() if isinstance(backends, dict) else []):
        key = b.get("api_key") if isinstance(b, dict) else None
        m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", key) if isinstance(key, str) else None
        if m and not os.environ.get(m.group(1)):
            out.append((f"backends.{name}.api_key", f"${{{m.group(1)}}} is not set in this "
                        "environment: requests routed to this backend will fail with 424 "
                        "backend_key_missing"))
    return out


def diagnose(path: str | Path) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the policy file at ``path`` (module docstring); both empty for
    a good file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        return [("", f"cannot read file: {e.strerror}")], []
    except UnicodeDecodeError as e:
        return [("", f"not UTF-8 text (byte {e.start})")], []
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [("", "invalid YAML: " + str(e).replace("<unicode string>", str(p)))], []
    if not isinstance(data, dict):
        return [("", "a policy must be a mapping (backends:, routes:, ...)")], []
    return _schema_problems(data) + _route_problems(data), _env_warnings(data)
