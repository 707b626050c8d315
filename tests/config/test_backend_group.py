"""A backend's deployments (``Backend.group``), asked on every request, are built once per set of
fields (issue 25): the same objects while nothing changes, new ones as soon as a field does."""

from __future__ import annotations

from prefixgate.config.routing import Deployment
from prefixgate.config.schema import Policy


def _policy() -> Policy:
    return Policy.model_validate({
        "backends": {
            "one": {"kind": "openai_compat", "base_url": "http://a/v1", "api_key": "${K1}"},
            "pool": {"kind": "openai_compat", "api_key": "${K2}", "deployments": [
                {"base_url": "http://b/v1"}, {"base_url": "http://c/v1", "name": "east",
                                              "api_key": "${K3}"}]}},
        "routes": [{"match": "*", "backend": "one"}]})


def test_a_plain_backend_is_one_deployment_built_once() -> None:
    b = _policy().backends["one"]
    first, again = b.group("one"), b.group("one")
    assert first == [Deployment(base_url="http://a/v1", api_key="${K1}", name="one")]
    assert again[0] is first[0] and again is not first  # same object, a fresh list
    first.clear()
    assert b.group("one") == again


def test_a_pool_names_its_deployments_and_defaults_their_keys() -> None:
    got = _policy().backends["pool"].group("pool")
    assert [(d.name, d.base_url, d.api_key) for d in got] == [
        ("pool#0", "http://b/v1", "${K2}"), ("east", "http://c/v1", "${K3}")]


def test_a_changed_field_or_name_gives_new_deployments() -> None:
    p = _policy()
    b, pool = p.backends["one"], p.backends["pool"]
    before = b.group("one")[0]
    assert b.group("other")[0].name == "other"
    b.base_url = "http://z/v1"
    assert b.group("one")[0].base_url == "http://z/v1" and b.group("one")[0] is not before
    b.api_key = "${K9}"
    assert b.group("one")[0].api_key == "${K9}"
    pool.deployments[0].name = "west"
    pool.api_key = "${K8}"
    assert [(d.name, d.api_key) for d in pool.group("pool")] == [("west", "${K8}"),
                                                                  ("east", "${K3}")]
