"""Resolve ``${ENV_VAR}`` key templates at send time; keys are never stored or logged."""

from __future__ import annotations

import os


class MissingSecret(Exception):
    """The environment variable a backend's api_key names is unset."""


def resolve_secret(template: str | None) -> str | None:
    """``"${OPENAI_API_KEY}"`` -> the variable's value; None -> None. Raises MissingSecret."""
    if template is None:
        return None
    name = template[2:-1]
    value = os.environ.get(name)
    if not value:
        raise MissingSecret(f"environment variable {name} is not set")
    return value


def redact(value: str) -> str:
    """A loggable stand-in for a secret: its first 3 characters and its length."""
    return f"{value[:3]}…({len(value)} chars)" if value else ""
