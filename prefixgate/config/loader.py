"""Load and check policy files.

``load_policy(path)`` returns a :class:`prefixgate.config.schema.Policy` or raises :class:`PolicyError`,
whose ``problems`` list holds ``(yaml_path, message)`` pairs such as
``("backends.openai.api_key", "api_key must be an environment reference ...")``.

``auth.keys_file`` (relative to the policy file) is made absolute on load; its keys are read
by :func:`load_keys_file` (``{keys: [ProxyKey, ...]}``, a missing file = no keys) and written by
:func:`save_keys_file` (atomically, mode 0600). A policy that names no keys file uses the
**default keys file** (:func:`default_keys_file`, applied by :func:`with_default_keys_file`):
``prefixgate keys add`` without ``--policy`` writes it, ``prefixgate serve`` reads it (issue 22,
item 6: a newcomer serving the shipped policy adds a key without writing a policy first).
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prefixgate.config.schema import AuthSettings, Backend, Policy, ProxyKey


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
    policy = parse_policy(data, str(p))
    if policy.auth.keys_file:
        kf = Path(policy.auth.keys_file).expanduser()
        policy.auth.keys_file = str(kf if kf.is_absolute() else (p.parent / kf).resolve())
    return policy


def load_keys_file(path: str | Path) -> list[ProxyKey]:
    """The keys in a keys file (``{keys: [...]}``); [] when the file does not exist. Raises
    PolicyError (unreadable, bad YAML, a key of the wrong shape) with yaml paths like
    ``keys[0].hash``."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise PolicyError(str(p), [("", f"cannot read keys file: {e}")]) from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise PolicyError(str(p), [("", "keys file must be a mapping {keys: [...]}")])
    try:
        return AuthSettings.model_validate({"keys": data.get("keys") or []}).keys
    except ValidationError as e:
        problems = [(_yaml_path(tuple(err["loc"])), err["msg"]) for err in e.errors()]
        raise PolicyError(str(p), problems) from None


def save_keys_file(path: str | Path, keys: list[ProxyKey]) -> None:
    """Write ``keys`` to ``path`` atomically (temp file + rename), readable by the owner only:
    the hashes are not secrets, but who may use the proxy is nobody else's business."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = "# prefixgate proxy keys: hashes only (prefixgate keys add / list / remove)\n"
    text += yaml.safe_dump({"keys": [k.model_dump(exclude_defaults=True) for k in keys]},
                           sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


KEYS_FILE_ENV = "PREFIXGATE_KEYS_FILE"
"""Environment variable naming the default keys file (overrides the XDG location)."""


def default_keys_file() -> Path:
    """The keys file of a policy that names none: ``$PREFIXGATE_KEYS_FILE`` when set, else
    ``$XDG_CONFIG_HOME/prefixgate/keys.yaml``, else ``~/.config/prefixgate/keys.yaml`` (the XDG
    Base Directory spec: an unset, empty or relative ``XDG_CONFIG_HOME`` means ``~/.config``).
    Always absolute, ``~`` expanded."""
    named = os.environ.get(KEYS_FILE_ENV, "")
    if named:
        return Path(named).expanduser().resolve()
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.config").expanduser()
    return base / "prefixgate" / "keys.yaml"


def with_default_keys_file(policy: Policy) -> Policy:
    """``policy`` with ``auth.keys_file`` = :func:`default_keys_file` when it names none (a copy;
    the argument is not changed). Inline ``auth.keys`` stay as they are: both admit."""
    if policy.auth.keys_file:
        return policy
    auth = policy.auth.model_copy(update={"keys_file": str(default_keys_file())})
    return policy.model_copy(update={"auth": auth})


def default_policy_text() -> str:
    """The YAML text of the policy shipped with the package (``prefixgate/config/default_policy.yaml``)."""
    return resources.files(__package__ or "prefixgate.config").joinpath("default_policy.yaml").read_text()


def default_policy() -> Policy:
    """The shipped default policy (``gpt-*`` / ``o[0-9]*`` to OpenAI, ``claude-*`` to Anthropic,
    the local engine by its id or aliases; no catch-all)."""
    return parse_policy(yaml.safe_load(default_policy_text()), "default_policy.yaml")


def resolve_route(policy: Policy, model: str) -> tuple[str, Backend] | None:
    """First route whose glob matches ``model`` (or the model ``policy.aliases`` maps it to)
    -> (its primary backend's name, Backend); None if none."""
    model = policy.aliases.get(model, model)
    for r in policy.routes:
        if fnmatch.fnmatchcase(model, r.match):
            name = r.chain()[0].backend
            return name, policy.backends[name]
    return None
