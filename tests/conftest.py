"""Suite-wide setup: the shared real test data must be present (it is read in place), the
hypothesis profiles, and a default keys file of the suite's own (``$PREFIXGATE_KEYS_FILE``).

Hypothesis profiles (``HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci`` — seeded: ``derandomize=True`` (examples derived from each test's name, the same on
  every run and machine), no example database (nothing carried between runs), no deadline (the
  2-core CI machine is shared; time limits belong in bench/). A failure prints its reproduce
  blob. Tests keep their own ``max_examples``.
- ``dev`` — random exploration for a developer hunting new failures (still no database, no
  deadline); rerun a failure it finds with the printed ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings

from tests.paths import DATA

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, with the fix, when ``../shared/data`` is missing (instead of N errors)."""
    if not (DATA / "traces" / "tau_bench_airline_gpt4o.json").exists():
        raise pytest.UsageError(
            f"test data not found at {DATA}: check out prefixgate next to the project's shared/ "
            "folder (../shared/data) or set PREFIXGATE_DATA_DIR to its data/ directory")


# ``prefixgate serve`` reads the default keys file (``~/.config/prefixgate/keys.yaml``) for a
# policy that names none: tests never read or write the developer's own; a test of the default
# location sets or deletes the variable itself.
os.environ["PREFIXGATE_KEYS_FILE"] = os.path.join(
    tempfile.mkdtemp(prefix="prefixgate-test-keys-"), "keys.yaml")
@pytest.fixture(autouse=True, scope="session")
def _tenant_salt_secret_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The per-install tenant salt secret (``prefixgate.proxy.http.salt_key.DEFAULT_PATH``,
    normally under ``~/.cache/prefixgate``) lives in a temp folder for the whole test session:
    tests never write into the real home."""
    from prefixgate.proxy.http import salt_key

    salt_key.DEFAULT_PATH = tmp_path_factory.mktemp("salt") / "tenant_salt.key"


@pytest.fixture(autouse=True)
def _rate_limit_window_from_test_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy built in a test counts its rate limits on a clock whose minute window starts one
    second before the test does: a test that fills ``rpm`` / ``tpm`` and expects the next request
    refused cannot see the real minute turn over in between (a ~1 % flake per test otherwise).
    Limiters a test builds with its own clock are untouched."""
    import time

    from prefixgate.proxy.http import auth, ratelimit

    shift = time.time() % 60 - 1.0
    real = auth.limiter_for

    def shifted(link: object) -> ratelimit.Limiter:
        limiter = real(link)  # type: ignore[arg-type]
        clock = lambda: time.time() - shift  # noqa: E731
        if isinstance(limiter, ratelimit.RedisLimiter):
            limiter._clock = clock
            limiter.local._clock = clock
        elif isinstance(limiter, ratelimit.MemoryLimiter):
            limiter._clock = clock
        return limiter

    monkeypatch.setattr(auth, "limiter_for", shifted)
