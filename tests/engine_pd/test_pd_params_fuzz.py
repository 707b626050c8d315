"""Hostile ``kv_transfer_params`` on a decode engine's handoff, generated (issue 34, items 2 and
12): whatever a client writes there, the answer is a 400 naming the field or a plain request,
never a 500; no claim (a wait on the link) starts and no first token is taken unless the params
carry the paired prefill instance's tag for this very prompt, transfer id and first tokens."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.pd.auth import ticket_tag
from prefixgate.local_engine.server.pd_handoff import PDHandoff
from prefixgate.local_engine.server.protocol import ApiError
from tests.engine_pd.conftest import PD_SECRET

PROMPT = list(range(100, 140))

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                    st.text(max_size=70))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=10), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=20)
params = st.one_of(values, st.fixed_dictionaries({
    "do_remote_prefill": st.one_of(st.just(True), values),
    "do_remote_decode": st.one_of(st.just(False), values),
    "transfer_id": st.one_of(st.integers(-5, 2**64), values),
    "first_token_ids": st.one_of(st.lists(st.integers(-3, 2**40), max_size=10), values),
    "transfer_tag": st.one_of(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
                              values),
}))


class _Role:
    """A decode role that records claims (a real one would wait on the link)."""

    def __init__(self) -> None:
        self.link = type("L", (), {"secret": PD_SECRET})()
        self.claims: list[int] = []

    def claim(self, transfer_id: int) -> None:
        self.claims.append(transfer_id)

    def stats(self) -> dict[str, Any]:
        return {}


def _run(hooks: PDHandoff, extra: dict[str, Any]) -> tuple[str, Any]:
    try:
        pd = hooks.parse(extra)
        asyncio.run(hooks.before(pd, PROMPT, None))
    except ApiError as e:
        assert e.status == 400 and e.param == "kv_transfer_params", e.body()
        return "400", None
    return "ok", pd


@settings(max_examples=400, deadline=None)
@given(value=params)
def test_made_up_params_never_start_a_claim_or_take_first_tokens(value: Any) -> None:
    role = _Role()
    hooks = PDHandoff("decode", decode_role=role)  # type: ignore[arg-type]
    outcome, pd = _run(hooks, {"kv_transfer_params": value})
    hooks.close()
    assert role.claims == []  # no made-up ticket reaches the link
    if outcome == "ok" and pd is not None:  # only a verified ticket may carry first tokens
        assert pd.kind == "decode" and isinstance(value, dict)
        assert value.get("transfer_tag") == ticket_tag(PD_SECRET, pd.transfer_id,
                                                        pd.first_token_ids, PROMPT, None)


@settings(max_examples=100, deadline=None)
@given(tid=st.integers(1, 2**62), first=st.lists(st.integers(0, 2**31 - 1), max_size=8),
       flip=st.integers(0, 63))
def test_a_real_ticket_claims_and_any_altered_byte_of_its_tag_is_refused(
        tid: int, first: list[int], flip: int) -> None:
    tag = ticket_tag(PD_SECRET, tid, first, PROMPT, None)
    good = {"do_remote_prefill": True, "transfer_id": tid, "first_token_ids": first,
            "transfer_tag": tag}
    role = _Role()
    hooks = PDHandoff("decode", decode_role=role)  # type: ignore[arg-type]
    assert _run(hooks, {"kv_transfer_params": good})[0] == "ok" and role.claims == [tid]
    bad = tag[:flip] + ("0" if tag[flip] != "0" else "1") + tag[flip + 1:]
    assert _run(hooks, {"kv_transfer_params": {**good, "transfer_tag": bad}})[0] == "400"
    hooks.close()
    assert role.claims == [tid]
