"""The counterfactual's partitions and the stage chain (:mod:`prefixgate.proxy.observe.insight`),
unit level: one model per real cache shared by sessions, kept apart by deployment and salt; a
pass credited only with what would not have been reusable without it (issue 19, items 3, 5)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

from prefixgate.cache.provider_models import RadixCacheModel
from prefixgate.cache.provider_models.token_radix import TokenCaches
from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.observe.insight import Analysis, Insight, model_blocks
from prefixgate.rewriter.analysis.tokens import make_counter
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context

RULES = "Follow the airline policy. Verify the user id first. Never book without a yes. " * 30
TOOLS = [{"function": {"name": f"tool_{i:02d}", "description": f"Tool number {i}.",
                       "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}},
          "type": "function"} for i in range(14)]


class Session:
    """One agent conversation through the real passes and one :class:`Insight`, the proxy's
    way: session memory read before, merged after; ``settings``: :class:`RewriteSettings`
    switches (none: the defaults)."""

    def __init__(self, insight: Insight, name: str, partition: str = "b\x00b",
                 **settings: Any) -> None:
        self.insight, self.name, self.partition = insight, name, partition
        self.memory: dict[str, Any] = {}
        self.settings = RewriteSettings(**settings)

    def send(self, body: dict[str, Any], salt: str = "") -> tuple[Analysis, Any]:
        ctx = Context(settings=self.settings, model="gpt-4o", provider="radix",
                      session_id=self.name, session=MappingProxyType(dict(self.memory)),
                      now_s=1_800_000_000.0)
        res = rewrite_request(body, "openai", ctx)
        self.memory.update(session_updates(res))
        a = self.insight.observe(session=self.name, backend="b", provider="radix", api="openai",
                                 model="gpt-4o", original=body, sent=res.body, view=body,
                                 ctx=ctx, partition=self.partition, salt=salt)
        return a, res


def _body(system: str, turns: int, tools: list[dict[str, Any]] = TOOLS,
          user: str = "") -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for k in range(turns):
        msgs.append({"role": "user", "content": f"{user}question {k}"})
        if k < turns - 1:
            msgs.append({"role": "assistant", "content": f"answer {k}"})
    return {"model": "gpt-4o", "messages": msgs, "tools": tools}


def test_a_pass_that_moves_nothing_is_credited_nothing() -> None:
    """Issue 19, item 5: canonicalize_tools re-keyed 14 identical tools on every request and
    was credited 35,895 "reusable" tokens. Same tools every request: nothing it did made a
    token reusable that the client's own bytes would not have. ``tool_order: "name"`` (opt-in)
    is the mode that re-keys them on every request (the default ``first_seen`` sends a session's
    first tools as sent)."""
    s = Session(Insight(), "s", tool_order="name")
    for turn in range(1, 16):
        a, res = s.send(_body(RULES, turn))
        canon = [e for e in res.edits if e.pass_name == "canonicalize_tools"][0]
        assert canon.applied and "moved 0 of 14" in canon.detail and canon.tokens_reusable > 0
        assert a.credits is not None and a.credits.get("canonicalize_tools", 0) == 0


def test_a_pass_that_makes_tools_reusable_is_credited_for_them() -> None:
    """The same tools registered in a different order each request (MCP servers connecting in
    another order): the client's bytes miss from the tools on; sorted, they hit."""
    s = Session(Insight(), "s")
    got = []
    for turn in range(1, 6):
        order = TOOLS[turn % 14:] + TOOLS[:turn % 14]
        a, _ = s.send(_body("Be brief.", turn, order))
        assert a.credits is not None
        got.append(a.credits.get("canonicalize_tools", 0))
    assert got[0] == 0 and all(c > 400 for c in got[1:]), got


def test_credits_telescope_to_the_rewritten_arm_minus_the_counterfactual() -> None:
    """Per request, the credits sum to (cached of the sent bodies) - (cached of the client's),
    two caches fed each stream from the start (the rule's exact identity). Hoisting (opt-in,
    ``MOVES_THE_MODEL_READS``) and ``tool_order: "name"`` (re-keys the tools every request) on:
    two passes that change bytes, one that pays and one that does not."""
    insight = Insight()
    count = make_counter("o200k_base")
    arm, cf = RadixCacheModel(count), RadixCacheModel(count)
    sessions = [Session(insight, f"s{i}", hoist_volatile=True, tool_order="name") for i in range(3)]
    total = 0
    for turn in range(1, 5):
        for i, s in enumerate(sessions):
            system = f"# Agent\nThe current time is 2024-05-15 10:{turn:02d}:{i:02d} EST.\n{RULES}"
            body = _body(system, turn, user=f"[{i}] ")
            a, res = s.send(body)
            got = arm.process(res.body, 0.0, model_blocks("radix", res.body, count))
            want = cf.process(body, 0.0, model_blocks("radix", body, count))
            assert a.cf_cached_tokens == want.cached_read_tokens
            assert a.credits is not None
            assert sum(a.credits.values()) == got.cached_read_tokens - want.cached_read_tokens
            total += a.credits.get("hoist_volatile", 0)
            assert a.credits.get("canonicalize_tools", 0) == 0
    assert total > 1000          # the clock moved out of the system prompt: that pays


def test_a_pass_first_changing_bytes_late_inherits_the_cache_it_would_have_had() -> None:
    """Its stage model starts as a copy of the previous stage's, not cold: moving nothing but
    the last message's bytes, it is credited about nothing, not minus the whole prefix."""
    insight = Insight()
    count = make_counter("o200k_base")
    part = insight._partition("p", "radix", count)
    bodies = [_body(RULES, t) for t in range(1, 5)]
    for b in bodies[:3]:  # the pass leaves these alone: no model of its own yet
        _, credits, _ = insight._chain(part, "radix", count, "", b, b, None)
        assert credits == {}
    assert part.chain == {}
    last = bodies[3]
    changed = {**last, "messages": [*last["messages"][:-1], {"role": "user", "content": "q!"}]}
    stages = [("canonicalize_tools", last), ("hoist_volatile", changed)]
    _, credits, _ = insight._chain(part, "radix", count, "", last, changed, stages)
    assert set(part.chain) == {"hoist_volatile"} and credits is not None
    assert abs(credits["hoist_volatile"]) <= 10, credits


def test_sessions_share_one_cache_deployments_and_salts_do_not() -> None:
    insight = Insight()
    body = _body(RULES, 1)

    def cf(session: str, partition: str = "b\x00b", salt: str = "") -> int:
        a = insight.observe(session=session, backend="b", provider="radix", api="openai",
                            model="gpt-4o", original=body, sent=body, partition=partition,
                            salt=salt)
        assert a.cf_cached_tokens is not None
        return a.cf_cached_tokens

    assert cf("s1") == 0
    assert cf("s2") > 1000                      # another conversation's prefix: cached anyway
    assert cf("s3", partition="b\x00b#1") == 0  # another deployment: another cache
    assert cf("s4", salt="tenant-a") == 0       # another tenant's salt: never shared
    assert cf("s5", salt="tenant-a") > 1000


def test_token_caches_keep_salts_apart_in_one_pool() -> None:
    caches = TokenCaches(capacity_tokens=30)
    ids = list(range(20))
    assert caches.process("p", ids, "a").cached_read_tokens == 0
    assert caches.process("p", ids, "a").cached_read_tokens == 19
    assert caches.process("p", ids, "b").cached_read_tokens == 0        # other salt: a miss
    assert caches.process("p", ids).cached_read_tokens == 0             # no salt: a miss too
    assert len(caches) == 1 and caches.stored_tokens() <= 30            # one pool, one capacity


def test_the_backend_seeing_the_clients_prompt_is_measured_not_credited() -> None:
    insight = Insight()
    body = _body(RULES, 2)
    copy = {**body, "messages": [dict(m) for m in body["messages"]]}
    a = insight.observe(session="s", backend="b", provider="openai", api="openai",
                        model="gpt-4o", original=body, sent=copy)
    assert a.same_as_sent and a.credits == {}
    keyed = {**copy, "prompt_cache_key": "k"}        # routes to another machine: not the same
    b = insight.observe(session="s", backend="b", provider="openai", api="openai",
                        model="gpt-4o", original=body, sent=keyed)
    assert not b.same_as_sent
    ids = [1, 2, 3, 4]
    c = insight.observe(session="s", backend="b", provider="radix", api="openai",
                        model="gpt-4o", original=body, sent=keyed, token_ids=ids,
                        sent_ids=list(ids))
    assert c.same_as_sent and c.cf_from_tokens and c.credits == {}


def test_after_a_pass_stops_the_cache_it_left_is_charged_to_it_not_hidden() -> None:
    """A route stands back: the next bodies go as the client sent them, but the cache holds
    the rewritten prefixes, so they miss where the client's own traffic would have hit. The
    credits say so, and the row's counterfactual is its measured figure less them."""
    from prefixgate.cache.ledger.store import LedgerRow
    from prefixgate.proxy.pipeline.record import measured_as_sent

    insight = Insight()
    count = make_counter("o200k_base")
    part = insight._partition("p", "radix", count)
    for t in range(1, 4):  # the pass moves a (constant) clock line, as hoisting did (issue 19)
        client = _body(f"Clock 1\n{RULES}", t)
        moved = {**client, "messages": [{"role": "system", "content": RULES},
                                        *client["messages"][1:]]}
        insight._chain(part, "radix", count, "", client, moved, [("hoist_volatile", moved)])
    client = _body(f"Clock 1\n{RULES}", 4)
    out0, credits, same = insight._chain(part, "radix", count, "", client, client, None)
    assert same and credits is not None and credits["hoist_volatile"] < -1000
    row = LedgerRow(prompt_tokens=2000, cached_tokens=50, input_usd=None)
    measured_as_sent(row, credits)
    assert row.cf_cached_tokens == min(2000, 50 - sum(credits.values()))
    assert row.cf_source == "modelled"
    plain = LedgerRow(prompt_tokens=2000, cached_tokens=50, input_usd=0.001)
    measured_as_sent(plain, {})          # no pass ever changed bytes here: purely measured
    assert (plain.cf_cached_tokens, plain.cf_input_usd, plain.cf_source) == (50, 0.001,
                                                                               "measured")


def test_a_pass_is_credited_its_stage_credit_never_its_own_estimate() -> None:
    from prefixgate.proxy.pipeline.record import pass_tokens_json
    from prefixgate.rewriter.types import Edit

    edits = [Edit("canonicalize_tools", True, "tools", "re-keyed", 900, 900, tokens_reusable=900),
             Edit("hoist_volatile", True, "system", "moved", 40, 50, tokens_reusable=3000,
                  tokens_added=10),
             Edit("prune_rag", False, "messages", "nothing to prune", tokens_reusable=50)]
    unknown = json.loads(pass_tokens_json(edits))          # no credits known: none claimed
    assert unknown == {"hoist_volatile": {"reusable": 0, "removed": 0, "added": 10}}
    known = json.loads(pass_tokens_json(edits, {"hoist_volatile": 700, "stabilise_passages": -5}))
    assert known == {"hoist_volatile": {"reusable": 700, "removed": 0, "added": 10},
                     "stabilise_passages": {"reusable": -5, "removed": 0, "added": 0}}


def test_the_partition_is_the_deployment_and_the_salt_what_the_backend_receives() -> None:
    from prefixgate.config.schema import Backend
    from prefixgate.proxy.http.tenants import tenant_salt
    from prefixgate.proxy.observe.insight import backend_salt, partition_key
    from prefixgate.proxy.routing.router import Target

    local = Backend(kind="local", base_url="http://e:1/v1")           # salted by tenant
    hosted = Backend(kind="openai", base_url="https://api.openai.com/v1")
    t_local = Target("*", "eng", local, "radix", "openai", False)
    t_hosted = Target("*", "oa", hosted, "openai", "openai", False)
    assert partition_key(t_local) == "eng\x00eng"                    # one engine, all sessions
    assert partition_key(t_local.on(local.group("eng")[0])) == "eng\x00eng"
    assert backend_salt(t_local, "acme", {}) == tenant_salt("acme")
    assert backend_salt(t_local, "acme", {"cache_salt": "c"}) == tenant_salt("acme", "c")
    assert backend_salt(t_local, "", {"cache_salt": "c"}) == "c"
    assert backend_salt(t_hosted, "acme", {}) == ""                  # the organisation's cache
