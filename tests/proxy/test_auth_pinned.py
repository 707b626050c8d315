"""Proxy keys at their edges (:mod:`prefixgate.proxy.http.auth`; issue 38: the tests vary what a
rule is about).

The dimensions varied: which header carries the key and in which scheme (Bearer, Basic, neither;
the API whose own header comes first), what a Basic credential decodes to (no colon, an empty
or spaced password, a colon inside the password, not base64, not UTF-8), the key and id formats
(length, alphabet, prefix), and the refusal a limit gives (its kind, limit and retry time in the
message, the header and the error type).
"""

from __future__ import annotations

import asyncio
import base64
import re

import pytest

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.config.schema import AuthSettings, LedgerSettings, ProxyKey
from prefixgate.proxy.core.errors import RateLimited, Unauthorized
from prefixgate.proxy.http.auth import (
    KEY_PREFIX,
    Guard,
    KeyStore,
    MemoryLimiter,
    _refused,
    basic_password,
    hash_key,
    needs_keys,
    new_key,
    new_key_id,
    presented_key,
)
from prefixgate.proxy.http.ratelimit import RedisLimiter, Refusal


def _basic(user_pass: bytes) -> str:
    return "Basic " + base64.b64encode(user_pass).decode()


@pytest.mark.parametrize("credential, password", [
    (b"user:pgk-secret", "pgk-secret"),
    (b":pgk-secret", "pgk-secret"),                 # any user name, the empty one too
    (b"user: pgk-secret ", "pgk-secret"),           # spaces around the password dropped
    (b"user:pa:ss", "pa:ss"),                       # the first colon splits, the rest is the password
    (b"user-without-colon", ""),
    (b"user:", ""),
    ("us\u00e9r:p\u00e4ss".encode(), "p\u00e4ss"),  # UTF-8 text
    (b"user:\xff\xfe", ""),                         # not UTF-8
])
def test_a_basic_credentials_password_is_read_after_the_first_colon(credential: bytes,
                                                                    password: str) -> None:
    token = _basic(credential).split(" ", 1)[1]
    assert basic_password(token) == password
    assert basic_password(" " + token + " ") == password
    assert presented_key({"authorization": _basic(credential)}, "openai") == (password or None)


@pytest.mark.parametrize("token", ["not base64!", "dXNlcjpwYXN", "dXNlcjpw YXNz", ""])
def test_a_basic_token_that_is_not_base64_gives_no_password(token: str) -> None:
    assert basic_password(token) == ""


@pytest.mark.parametrize("api, first", [("anthropic", "x"), ("openai", "bearer")])
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "Basic"])
def test_the_apis_own_header_comes_first_and_the_other_is_the_fallback(api: str, first: str,
                                                                       scheme: str) -> None:
    auth = _basic(b"u:from-auth") if scheme == "Basic" else f"{scheme} from-auth"
    both = {"authorization": auth, "x-api-key": " from-x "}
    assert presented_key(both, api) == ("from-x" if first == "x" else "from-auth")
    assert presented_key({"authorization": auth}, api) == "from-auth"
    assert presented_key({"x-api-key": "from-x"}, api) == "from-x"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Token abc"}, {"x-api-key": "  "},
                                     {"authorization": _basic(b"u:pgk-x").replace("Basic", "Token")},
                                     {"authorization": "Bearer "}, {"authorization": "Bearer"}])
def test_no_key_is_none(headers: dict[str, str]) -> None:
    for api in ("anthropic", "openai"):
        assert presented_key(headers, api) is None


def test_keys_and_ids_have_their_documented_form() -> None:
    keys = {new_key() for _ in range(50)}
    assert len(keys) == 50 and KEY_PREFIX == "pgk-"
    assert all(re.fullmatch(r"pgk-[A-Za-z0-9_-]{43}", k) for k in keys)
    ids = {new_key_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"k_[0-9a-f]{12}", i) for i in ids)


@pytest.mark.parametrize("host", ["localhostX", "XLOCALHOST", "127.0.0.1X", "[::1]X"])
def test_a_host_is_read_whole_before_it_is_judged_loopback(host: str) -> None:
    assert needs_keys(host) is True


@pytest.mark.parametrize("kind, limit, retry", [("requests", 3, 1), ("tokens", 1000, 59)])
def test_a_refusal_names_its_kind_limit_and_retry_time(kind: str, limit: int, retry: int) -> None:
    err = _refused("k_abc", Refusal(kind, limit, retry))  # type: ignore[arg-type]
    assert err.message == (f"Rate limit reached for proxy key k_abc on {kind} per minute: "
                           f"limit {limit}. Retry in {retry} s.")
    assert (err.status, err.type, err.retry_after_s) == (429, kind, retry)
    assert err.headers == {"retry-after": str(retry)}


# --- the guard: which key, which message, which counters ---------------------------------------

KEYS = {"k_anth": "pgk-" + "a" * 43, "k_open": "pgk-" + "b" * 43}


def _keyed_guard() -> Guard:
    keys = [ProxyKey(id=i, hash=hash_key(k)) for i, k in KEYS.items()]
    return Guard(KeyStore(AuthSettings(keys=keys)), MemoryLimiter())


@pytest.mark.parametrize("api, who", [("anthropic", "k_anth"), ("openai", "k_open")])
def test_the_guard_admits_the_key_of_the_apis_own_header_first(api: str, who: str) -> None:
    headers = {"x-api-key": KEYS["k_anth"], "authorization": f"Bearer {KEYS['k_open']}"}
    assert asyncio.run(_keyed_guard().admit(headers, api)) == who


@pytest.mark.parametrize("headers, what", [
    ({}, "No proxy key provided"),
    ({"x-api-key": "  "}, "No proxy key provided"),
    ({"x-api-key": "pgk-wrong"}, "Incorrect proxy key provided"),
    ({"authorization": "Bearer pgk-wrong"}, "Incorrect proxy key provided"),
])
def test_a_missing_key_and_a_wrong_key_are_told_apart(headers: dict[str, str], what: str) -> None:
    for api in ("anthropic", "openai"):
        with pytest.raises(Unauthorized) as err:
            asyncio.run(_keyed_guard().admit(headers, api))
        assert err.value.message == (f"{what}. Send the key prefixgate gave you as 'Authorization: "
                                     "Bearer <key>' (OpenAI SDKs) or 'x-api-key: <key>' (Anthropic SDKs).")
        assert err.value.status == 401


def test_an_open_guard_admits_everyone_as_no_key_and_counts_nothing() -> None:
    g = Guard.open()
    assert isinstance(g.limiter, MemoryLimiter) and g.reasons() == []
    assert asyncio.run(g.admit({}, "openai", limit=True)) == ""
    assert asyncio.run(g.limit("", {"messages": []}, 10)) is None
    asyncio.run(g.drain())                       # a memory limiter has nothing to drain


def test_the_guard_counts_in_redis_through_the_apps_link_and_in_memory_without_one() -> None:
    link = RedisLink("redis://127.0.0.1:1/0", "pg-test:")   # never connected here
    shared = Guard.from_policy(AuthSettings(), LedgerSettings(), link)
    assert isinstance(shared.limiter, RedisLimiter) and shared.limiter.link is link
    assert isinstance(Guard.from_policy(AuthSettings(), LedgerSettings()).limiter, MemoryLimiter)


def test_draining_the_guard_waits_for_its_limiters_writes() -> None:
    drained: list[bool] = []

    class Draining(MemoryLimiter):
        async def drain(self) -> None:
            drained.append(True)

    asyncio.run(Guard(KeyStore(AuthSettings()), Draining()).drain())
    assert drained == [True]


@pytest.mark.parametrize("rpm", [1, 2, 3])
def test_an_admission_that_limits_counts_one_request_and_no_tokens(rpm: int) -> None:
    """``admit(limit=True)`` (the side endpoints): each call one request against ``rpm``, no
    tokens against ``tpm``, refused once the key is at its requests."""
    key = ProxyKey(id="k_lim", hash=hash_key(KEYS["k_open"]), rpm=rpm, tpm=1_000)
    g = Guard(KeyStore(AuthSettings(keys=[key])), MemoryLimiter())
    headers = {"authorization": f"Bearer {KEYS['k_open']}"}

    async def run() -> None:
        for _ in range(rpm):
            assert await g.admit(headers, "openai", limit=True) == "k_lim"
        with pytest.raises(RateLimited) as err:
            await g.admit(headers, "openai", limit=True)
        assert err.value.type == "requests" and "proxy key k_lim on requests" in err.value.message
        assert await g.admit(headers, "openai") == "k_lim"       # without limit: not counted

    asyncio.run(run())
    assert isinstance(g.limiter, MemoryLimiter) and g.limiter.used("k_lim") == (rpm, 0)


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _tpm_guard(clock: _Clock) -> Guard:
    key = ProxyKey(id="k_t", hash=hash_key(KEYS["k_open"]), tpm=1_000_000)
    return Guard(KeyStore(AuthSettings(keys=[key])), MemoryLimiter(clock))


def test_a_key_gone_since_admission_has_no_limit() -> None:
    g = _tpm_guard(_Clock(600.0))
    assert asyncio.run(g.limit("k_gone", {"messages": []}, 10)) is None


@pytest.mark.parametrize("delta", [-5, 0, 1, 7])
def test_a_difference_settled_in_a_later_window_is_added_there_when_positive(delta: int) -> None:
    clock = _Clock(600.0)                                        # window 10, its first second
    g = _tpm_guard(clock)
    t = asyncio.run(g.limit("k_t", {"messages": [{"role": "user", "content": "x" * 400}]}, 0))
    assert t is not None and t.estimate > 5
    clock.now = 660.0                                            # window 11
    g.settle(t, t.estimate + delta, 0, 200)
    lim = g.limiter
    assert isinstance(lim, MemoryLimiter)
    assert lim.used("k_t", 10) == (1, t.estimate) and lim.used("k_t", 11) == (0, max(delta, 0))


def test_a_keys_tickets_in_flight_are_forgotten_as_they_settle() -> None:
    g = _tpm_guard(_Clock(600.0))
    body = {"messages": [{"role": "user", "content": "hello"}]}
    a, b = (asyncio.run(g.limit("k_t", body, 0)) for _ in range(2))
    assert a is not None and b is not None and len(g._open["k_t"]) == 2
    g.settle(a, 5, 1, 200)
    assert set(g._open["k_t"]) == {b}
    g.settle(b, 5, 1, 200)
    assert "k_t" not in g._open


def test_a_limiter_that_fails_at_settlement_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    g = _tpm_guard(_Clock(600.0))
    t = asyncio.run(g.limit("k_t", {"messages": []}, 0))
    assert t is not None

    def broken(*_: object) -> None:
        raise OSError("counter store down")

    g.limiter.add_tokens = broken  # type: ignore[method-assign]
    with caplog.at_level("ERROR", logger="prefixgate.auth"):
        g.settle(t, 50, 5, 200)
    assert t.settled
    assert [r.getMessage() for r in caplog.records] == ["rate limiter: tokens not counted"]
    assert caplog.records[0].exc_info is not None
