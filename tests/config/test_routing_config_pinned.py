"""The routing policy sections' own rules, pinned value by value (issue 21): base URLs, a
route's primary backend, and the chain of backends and fallbacks with each one's model name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefixgate.config.routing import Deployment, FallbackTarget, RouteTargets, check_base_url


@pytest.mark.parametrize(("url", "want"), [
    ("http://10.0.0.1:8000/v1", "http://10.0.0.1:8000/v1"),
    ("http://10.0.0.1:8000/v1/", "http://10.0.0.1:8000/v1"),
    ("https://api.example.com///", "https://api.example.com"),
    ("http://svcX/", "http://svcX"),  # only slashes go, not the letters before them
])
def test_a_base_url_loses_its_trailing_slashes(url: str, want: str) -> None:
    assert check_base_url(url) == want
    assert Deployment(base_url=url).base_url == want


@pytest.mark.parametrize("url", ["ftp://host/v1", "10.0.0.1:8000", "", "HTTP//x", " http://x"])
def test_a_base_url_without_http_scheme_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="^base_url must start with http:// or https://$"):
        check_base_url(url)
    with pytest.raises(ValidationError, match="base_url must start with http:// or https://"):
        Deployment(base_url=url)


def test_a_deployment_defaults_to_no_key_and_no_name() -> None:
    d = Deployment(base_url="http://a")
    assert (d.api_key, d.name) == (None, "")


def test_a_route_needs_exactly_one_way_to_name_its_primary() -> None:
    with pytest.raises(ValidationError, match="a route needs backend or backends"):
        RouteTargets()
    with pytest.raises(ValidationError, match="give backend or backends, not both"):
        RouteTargets(backend="a", backends=["a", "b"])
    assert RouteTargets(backends=["b", "a"]).backend == "b"  # the first of the list
    assert RouteTargets(backend="x").backend == "x"


def pairs(t: RouteTargets) -> list[tuple[str, str | None]]:
    return [(f.backend, f.model) for f in t.chain()]


def test_the_chain_is_own_backends_then_fallbacks_each_with_its_model() -> None:
    t = RouteTargets(backend="p", model="m", fallbacks=[
        "f", FallbackTarget(backend="g", model="gm"), {"backend": "h"}])
    # a fallback named by string is asked for the route's model; one with its own keeps it
    assert pairs(t) == [("p", "m"), ("f", "m"), ("g", "gm"), ("h", None)]
    assert pairs(RouteTargets(backends=["a", "b"], fallbacks=["c"])) == [("a", None), ("b", None),
                                                                          ("c", None)]
    assert pairs(RouteTargets(backends=["a", "b"], model="alias")) == [("a", "alias"), ("b", "alias")]
    assert pairs(RouteTargets(backend="solo")) == [("solo", None)]


def test_a_backend_given_alone_is_its_own_chain_even_without_validation() -> None:
    """``chain`` on an unvalidated route (model_construct) uses ``backend`` when there is no list."""
    t = RouteTargets.model_construct(backend="p", backends=[], fallbacks=[], model=None)
    assert pairs(t) == [("p", None)]


def test_the_kv_events_block_hash_seed_is_the_given_seed_else_the_engines_default() -> None:
    """``hash_seed``: ``seed`` when given (an empty one too), else vLLM's ``vllm-none-hash`` for
    ``sha256_cbor`` and no seed for our engine's ``sha256`` (docs/routing.md)."""
    from prefixgate.config.routing import KVEventsSettings

    ep = "tcp://10.0.0.1:5557"
    assert KVEventsSettings(endpoint=ep).hash_seed() == ""
    assert KVEventsSettings(endpoint=ep, hash="sha256_cbor").hash_seed() == "vllm-none-hash"
    for h in ("sha256", "sha256_cbor"):
        assert KVEventsSettings(endpoint=ep, hash=h, seed="1234").hash_seed() == "1234"
        assert KVEventsSettings(endpoint=ep, hash=h, seed="").hash_seed() == ""
