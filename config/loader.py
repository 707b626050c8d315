"""Load and check policy files.

``load_policy(path)`` returns a :class:`config.schema.Policy` or raises :class:`PolicyError`,
whose ``problems`` list holds ``(yaml_path, message)`` pairs such as
``("backends.openai.api_key", "api_key must be an environment reference ...")``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from config.schema import Backend, Policy


@dataclass
class PolicyError(Exception):
    """A policy file that cannot be used; ``problems`` = [(yaml path, message), ...]."""

    source: str
    problems: list[tuple[str, str]]

    def __str__(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += [f"  {p or '<root>'}: {m}" for p, m in self.problems]
        return "\n".join(lines)


def _yaml_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def parse_policy(data: Any, source: str = "<policy>") -> Policy:
    """Validate an already-parsed YAML/JSON mapping. Raises PolicyError."""
    if not isinstance(data, dict):
        raise PolicyError(source, [("", "policy must be a mapping")])
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        problems = [(_yaml_path(tuple(err["loc"])), err["msg"]) for err in e.errors()]
        raise PolicyError(source, problems) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a YAML policy file (UTF-8). Raises PolicyError (unreadable or not
    UTF-8, bad YAML, schema errors)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PolicyError(str(p), [("", f"cannot read file: {e.strerror}")]) from None
    except UnicodeDecodeError as e:
        raise PolicyError(str(p), [("", f"not UTF-8 text (byte {e.start}): policy files are "
                                        "YAML in UTF-8")]) from None
    except yaml.YAMLError as e:
        raise PolicyError(str(p), [("", f"invalid YAML: {e}")]) from None
    return parse_policy(data, str(p))


def default_policy_text() -> str:
    """The YAML text of the policy shipped with the package (``config/default_policy.yaml``)."""
    return resources.files("config").joinpath("default_policy.yaml").read_text()


def default_policy() -> Policy:
    """The shipped default policy: every model routed to the embedded local engine."""
    return parse_policy(yaml.safe_load(default_policy_text()), "default_policy.yaml")


def resolve_route(policy: Policy, model: str) -> tuple[str, Backend] | None:
    """First route whose glob matches ``model`` -> (backend name, Backend); None if none."""
    for r in policy.routes:
        if fnmatch.fnmatchcase(model, r.match):
            return r.backend, policy.backends[r.backend]
    return None
