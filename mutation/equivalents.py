"""Equivalent mutants of :mod:`mutation.score`: mutants no test can kill because they do
not change what the module does (issue 21). Each entry, by module: the mutant's name (mutmut's,
without the module prefix) -> (the mutated line as its diff shows it, the one-line reason).
The score script checks the line against the mutant's diff, so an entry that no longer matches
(the code moved) counts as survived until it is looked at again.
"""

from __future__ import annotations

from mutation.equivalents_engine import ENGINE
from mutation.equivalents_guard import GUARD
from mutation.equivalents_varied import VARIED

UNREACHABLE_FALLBACK = ("unreachable: with session_balance >= 1, the group's live keys number total - 1 < "
                        "n * cap, so some deployment is under the cap and the generator never runs out")

PROTOCOL = "the Limiter Protocol's method is never run: each limiter has its own signature and defaults"
PRUNE = ("_window only skips a repeated prune within one window; pruning is idempotent, so a prune "
         "more (or one skipped in a window with no counters yet) keeps the same counters")
NEVER_RAISES = ("the drained tasks (_add) never raise: RedisLink.run answers the fallback for any Redis "
                "error and MemoryLimiter.add_tokens cannot fail, so return_exceptions is never used")

EMPTY_MATCH = ("a one-id prompt's match of ids[:-1] = [] is 0 (the root has no key), as the else "
               "branch says: the match only advances the recency clock")
ROOT = "the root's key and last_access are never read: match / insert start at its children, and the "\
       "root never enters the eviction heap"
SPLIT = ("the assertion holds on every call (insert splits a child under a parent where 0 < n < its "
         "length), so a weaker one never fires either")

SALT_ONE = ("a salted prompt of 0 or 1 ids matches at most the salt's pseudo id, and max(0, match - 1) "
            "is then 0, as the else branch says")

INTEGERS = "Generator.integers(n, size=...) draws from [0, n) as integers(0, n, size=...) does, same stream"
SIDE = ("entered only when strict[0] > eps or strict[1] < -eps with strict[0] <= strict[1] and eps >= 0, "
        "where strict[1] > eps and strict[0] >= eps each agree with strict[0] > eps")
FLOATS = "the values are Python floats already (float(...)): numpy infers float64, and an empty list is float64 too"
ERRSTATE = ("the division never sees a zero (np.where puts 1 where den <= 0) nor a NaN, so there is no "
            "warning to silence")
OUTER = "the outer np.where answers NaN wherever den <= 0, whatever the inner division gave there"

REBUILT = ("an unchanged block rebuilt with its own text holds equal content: stabilise returns the prompt "
           "itself unless a retrieval moved, and then the rebuilt block renders to the same bytes")

SQL_CASE = "SQLite keywords and (unquoted) column names are case-insensitive: the same statement"
SEPARATORS = ("the data column is only read back through json.loads: the default separators change its "
              "whitespace, not a value")

SORTED = ("output indexes are unique, so the (index, item) pairs sort by the index alone and the "
          "item dicts are never compared")
OPEN_TEXT = "the item's content is replaced by [] on the same line: the text handed to text_item is never seen"

NO_RAW = "Translating.encode never reads raw: it encodes request(body) of the (rewritten) body"

TARGET_UNREAD = ("_forward reads only target.api_key(), which reads backend, backend_name, deployment and tenant: "
                 "route, provider, wire and translate are never read")
OPENAI_SHAPE = 'error_body answers the Anthropic shape only for api == "anthropic": any other value is the OpenAI shape'

CHECKED_DEFAULT = ("check_fields (run by to_chat before any response is built) refuses every value of this "
                   "field but absent / null / its default, so the echo is the default either way")
CLASS_CODE = "InvalidRequest's class code is invalid_value: code=None (or left out) keeps that same code"
JOINED = ("an assistant message holding tool_calls here is one this loop made (content None) or joined (content "
          "empty), so `not last.get('content')` is already true whenever `'tool_calls' in last` is")

UP = "FastAPI upper-cases a route's methods ({m.upper() for m in methods}): the same route"
GETD = "add_api_route's default methods are ['GET']: the same route"

EQUIVALENT: dict[str, dict[str, tuple[str, str]]] = {
    "prefixgate/proxy/routing/breaker.py": {
        "xǁBreakerǁavailable__mutmut_1": (
            "if not self.settings.enabled and self.state == CLOSED:",
            "a disabled breaker never leaves CLOSED (no trip, no peer opening; settings are fixed per "
            "board) and a CLOSED breaker never has probing set, so both forms answer True"),
    },
    "prefixgate/proxy/routing/balance.py": {
        "x_rendezvous__mutmut_3": (
            'scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:9] for n in names]',
            "comparing 9 bytes instead of 8 changes the order only when two 64-bit prefixes collide "
            "(probability 2^-64 per pair)"),
        "x_rendezvous_order__mutmut_3": (
            'scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:9] for n in names]',
            "as x_rendezvous__mutmut_3: a 2^-64 collision of the 8-byte prefixes"),
        "xǁBalancerǁ_forget__mutmut_5": (
            "self._keys.popitem(last=None)",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁBalancerǁ_keep__mutmut_7": (
            "old, _ = self._keys.popitem(last=None)[1]",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁBalancerǁacquire__mutmut_10": (
            "done = None",
            "`done` is only read as `not done`: None and False are both falsy"),
        "xǁBalancerǁplace__mutmut_39": (
            "pick = next((i for i in order if self._live[names[i]] < cap), None)", UNREACHABLE_FALLBACK),
        "xǁBalancerǁplace__mutmut_41": (
            "pick = next((i for i in order if self._live[names[i]] < cap), )", UNREACHABLE_FALLBACK),
        "xǁBalancerǁplace__mutmut_43": (
            "pick = next((i for i in order if self._live[names[i]] < cap), order[1])", UNREACHABLE_FALLBACK),
        "xǁBalancerǁfollow__mutmut_5": (
            "if held is None or held[1] == name:",
            "held[1] is the float seen-time, never a name, so a follow to the same deployment goes on: "
            "-1 then +1 on one count, and re-assigning an OrderedDict key keeps its age and order"),
    },
    "prefixgate/proxy/routing/retries.py": {
        "xǁSenderǁorder__mutmut_25": (
            "placed, new_key, matches = None, True, None",
            "new_key is replaced in prefix / exact mode and never read by choose in round_robin / "
            "least_load (they return first)"),
        "xǁSenderǁorder__mutmut_66": (
            "placed, None)",
            "a new key's matches are never asked (None), and choose with a placement and no matches "
            "returns the placement as 'affinity', which is what new_key makes it return"),
        "xǁSenderǁorder__mutmut_74": (
            "placed, )",
            "as order__mutmut_66: new_key defaults to False, and a new key has no matches to follow"),
        "xǁSenderǁrun__mutmut_30": (
            "sent, paid = 0, True  # paid: the next send's budget token is already taken",
            "`paid` is read only when `sent` is non-zero, and the first send resets it to False"),
        "xǁSenderǁrun__mutmut_62": (
            "sent, paid = sent - 1, False",
            "`sent` is read only for its truth: -1, -2, ... are as non-zero as 1, 2, ..."),
        "xǁSenderǁrun__mutmut_63": (
            "sent, paid = sent + 2, False",
            "`sent` is read only for its truth: 2, 4, ... are as non-zero as 1, 2, ..."),
        "xǁSenderǁrun__mutmut_187": (
            "go_on = None",
            "`go_on` is read only as `not go_on`: None and False are both falsy"),
    },
    "prefixgate/proxy/routing/kv_index.py": {
        "xǁBlockIndexǁapply__mutmut_31": (
            "self.blocks.popitem(last=None)",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁBlockIndexǁapply__mutmut_47": (
            "if self.blocks.pop(h, 1) is None:",
            "a held block's value is None; the default (0 or 1) only has to be something else"),
    },
    "prefixgate/proxy/routing/kv_events.py": {
        "x_decode_batch__mutmut_3": (
            'doc = msgpack.unpackb(payload, raw=None, strict_map_key=False)',
            'msgpack 1.x unpacks str as str by default (raw=False) and reads raw / strict_map_key for their truth: None is False'),
        "x_decode_batch__mutmut_4": (
            'doc = msgpack.unpackb(payload, raw=False, strict_map_key=None)',
            'msgpack 1.x unpacks str as str by default (raw=False) and reads raw / strict_map_key for their truth: None is False'),
        "x_decode_batch__mutmut_6": (
            'doc = msgpack.unpackb(payload, strict_map_key=False)',
            'msgpack 1.x unpacks str as str by default (raw=False) and reads raw / strict_map_key for their truth: None is False'),
        "xǁKVEventStreamǁ__init____mutmut_13": (
            'self.seen_at = float("-INF")',
            'float() reads "-INF" as "-inf": the same value'),
        "xǁKVEventStreamǁlag_p99_ms__mutmut_8": (
            'return xs[min(len(xs) + 1, int(0.99 * len(xs)))]',
            'int(0.99 * n) <= n - 1 for every n >= 1, so the min never takes its first argument'),
        "xǁKVEventStreamǁ_session__mutmut_7": (
            'sub.setsockopt(zmq.LINGER, 1)',
            'LINGER is how long close() waits to flush unsent messages; nothing is left unsent when these sockets close (a reply was read or given up on), so 0 and 1 ms close alike'),
        "xǁKVEventStreamǁreplay_from__mutmut_12": (
            'sock.setsockopt(zmq.LINGER, 1)',
            'LINGER is how long close() waits to flush unsent messages; nothing is left unsent when these sockets close (a reply was read or given up on), so 0 and 1 ms close alike'),
        "xǁKVEventStreamǁ_session__mutmut_18": (
            'if await sub.poll(self.probe_s * 1001.0):',
            'the poll bound in ms times 1.001 instead of 1000: the same bound within 0.1 %, a timing, no different answer'),
        "xǁKVEventStreamǁreplay_from__mutmut_32": (
            'if not await sock.poll(self.replay_timeout_s * 1001.0):',
            'the poll bound in ms times 1.001 instead of 1000: the same bound within 0.1 %, a timing, no different answer'),
        "xǁKVEventStreamǁ_session__mutmut_14": (
            'await asyncio.sleep(1.05)  # let the SUB join, so nothing falls between it and the resync',
            'a longer wait before the first resync: a timing; what falls in it is still caught by the resync that follows'),
        "xǁKVEventStreamǁ_session__mutmut_28": (
            'await self.handle(int.from_bytes(frames[1], "big", signed=None), frames[2])',
            'live batch numbers are never negative (publishers count up from 0): signed or not, the same number'),
        "xǁKVEventStreamǁ_session__mutmut_30": (
            'await self.handle(int.from_bytes(frames[1], signed=True), frames[2])',
            "Python 3.11's int.to_bytes / from_bytes default to byteorder 'big'"),
        "xǁKVEventStreamǁ_session__mutmut_31": (
            'await self.handle(int.from_bytes(frames[1], "big", ), frames[2])',
            'live batch numbers are never negative (publishers count up from 0): signed or not, the same number'),
        "xǁKVEventStreamǁ_session__mutmut_35": (
            'await self.handle(int.from_bytes(frames[1], "big", signed=False), frames[2])',
            'live batch numbers are never negative (publishers count up from 0): signed or not, the same number'),
        "xǁKVEventStreamǁ_session__mutmut_45": (
            'self.synced = None',
            '`synced` is read only for its truth: None and False are both falsy'),
        "xǁKVEventStreamǁreplay_from__mutmut_20": (
            'await sock.send_multipart([b"", start.to_bytes(8, "big", signed=None)])',
            'start is 0 or last + 1, never negative: signed and unsigned give the same 8 bytes'),
        "xǁKVEventStreamǁreplay_from__mutmut_22": (
            'await sock.send_multipart([b"", start.to_bytes(8, signed=True)])',
            "Python 3.11's int.to_bytes / from_bytes default to byteorder 'big'"),
        "xǁKVEventStreamǁreplay_from__mutmut_23": (
            'await sock.send_multipart([b"", start.to_bytes(8, "big", )])',
            'start is 0 or last + 1, never negative: signed and unsigned give the same 8 bytes'),
        "xǁKVEventStreamǁreplay_from__mutmut_27": (
            'await sock.send_multipart([b"", start.to_bytes(8, "big", signed=False)])',
            'start is 0 or last + 1, never negative: signed and unsigned give the same 8 bytes'),
        "xǁKVEventStreamǁreplay_from__mutmut_46": (
            'seq = int.from_bytes(frames[0], "big", signed=None)',
            "only the end frame's number is negative, and its payload is empty, which ends the replay by itself"),
        "xǁKVEventStreamǁreplay_from__mutmut_48": (
            'seq = int.from_bytes(frames[0], signed=True)',
            "Python 3.11's int.to_bytes / from_bytes default to byteorder 'big'"),
        "xǁKVEventStreamǁreplay_from__mutmut_49": (
            'seq = int.from_bytes(frames[0], "big", )',
            "only the end frame's number is negative, and its payload is empty, which ends the replay by itself"),
        "xǁKVEventStreamǁreplay_from__mutmut_53": (
            'seq = int.from_bytes(frames[0], "big", signed=False)',
            "only the end frame's number is negative, and its payload is empty, which ends the replay by itself"),
        "xǁKVEventStreamǁreplay_from__mutmut_54": (
            'if seq == END_SEQ and not frames[1]:',
            "the replay protocol's only empty payload is the end frame's ([-1, b'']): both halves hold together"),
        "xǁKVEventStreamǁreplay_from__mutmut_67": (
            'self._apply(seq, None, events, live=False)',
            "ts is read only for a live batch's lag; replayed batches are not live (None and False are both falsy)"),
        "xǁKVEventStreamǁreplay_from__mutmut_69": (
            'self._apply(seq, ts, events, live=None)',
            "ts is read only for a live batch's lag; replayed batches are not live (None and False are both falsy)"),
        "xǁKVEventStreamǁreplay_from__mutmut_85": (
            'self._apply(seq, None, events, live=False)',
            "ts is read only for a live batch's lag; replayed batches are not live (None and False are both falsy)"),
        "xǁKVEventStreamǁreplay_from__mutmut_87": (
            'self._apply(seq, ts, events, live=None)',
            "ts is read only for a live batch's lag; replayed batches are not live (None and False are both falsy)"),
        "xǁKVEventStreamǁreplay_from__mutmut_93": (
            'elif seq >= self.seq.last + 1:',
            'seq == last + 1 is taken by the branch before, so >= and > meet the same numbers here'),
    },
    "prefixgate/proxy/routing/kv_shared.py": {
        "xǁSharedKVIndexǁrefresh__mutmut_11": (
            'if now - self._read_at.get(key, float("-INF")) < READ_MAX_AGE_S:',
            'float() reads "-INF" as "-inf": the same value'),
    },
    "prefixgate/proxy/routing/shared.py": {
        "x_others_load__mutmut_8": (
            'count, _, expires = entry.rpartition(" ")',
            "load entries are written only by _flush as '<int> <float>' with one space, which "
            "partition and rpartition split alike"),
        "xǁSharedRoutingǁ__init____mutmut_4": (
            "self.replica = replica or uuid.uuid4().hex[:13]",
            "the default replica id only has to be unique per process: 12 or 13 hex digits alike"),
        "xǁSharedRoutingǁ_apply_breaker__mutmut_17": (
            'if self._applied.get(name, float("-INF")) > stamp:',
            'float() reads "-INF" as "-inf": the same value'),
        "xǁSharedRoutingǁrefresh__mutmut_14": (
            'if self.clock() - self._read_at.get(key, float("-INF")) < self.max_age_s:',
            'float() reads "-INF" as "-inf": the same value'),
        "xǁSharedRoutingǁ_read__mutmut_22": (
            "self._fails[n] = None",
            "_fails is read only as `not self._fails.get(name)`: None and 0 are both falsy"),
        "xǁSharedRoutingǁsucceeded__mutmut_5": (
            "self._fails[name] = None",
            "_fails is read only as `not self._fails.get(name)`: None and 0 are both falsy"),
        "xǁSharedRoutingǁ_read__mutmut_47": (
            "and now - self._written.get(n, 1.0) > self.load_ttl_s / 2):",
            "the default only applies before a replica's first write, and the unix clock is far "
            "past load_ttl_s / 2 + 1 s: both defaults ask for the write"),
    },
    "prefixgate/config/routing.py": {
        "xǁRouteTargetsǁchain__mutmut_4": (
            'own = self.backends or [self.backend or "XXXX"]',
            "unreachable: the model validator sets backend to backends[0] whenever it is None, so "
            "the empty-string default is never taken"),
    },
    "prefixgate/proxy/http/ratelimit.py": {
        "x_window_of__mutmut_3": (
            "w = int(now / WINDOW_S)",
            "unix time is >= 0, where int() truncates the quotient as floor does (no float just under "
            "60 k rounds up to k: checked for k < 200,000)"),
        "xǁLimiterǁadmit__mutmut_1": (
            "async def admit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int = 1,",
            PROTOCOL),
        "xǁLimiterǁadmit__mutmut_2": ("pending: int = 1) -> Refusal | None:", PROTOCOL),
        "xǁMemoryLimiterǁ__init____mutmut_4": ("self._window = None", PRUNE),
        "xǁMemoryLimiterǁ__init____mutmut_5": ("self._window = +1", PRUNE),
        "xǁMemoryLimiterǁ__init____mutmut_6": ("self._window = -2", PRUNE),
        "xǁMemoryLimiterǁ_prune__mutmut_7": ("self._window = None", PRUNE),
        "xǁRedisLimiterǁdrain__mutmut_1": (
            "await asyncio.gather(*list(self._tasks), return_exceptions=None)", NEVER_RAISES),
        "xǁRedisLimiterǁdrain__mutmut_3": ("await asyncio.gather(*list(self._tasks), )", NEVER_RAISES),
        "xǁRedisLimiterǁdrain__mutmut_5": (
            "await asyncio.gather(*list(self._tasks), return_exceptions=False)", NEVER_RAISES),
    },
    "prefixgate/cache/ledger/attribution.py": {
        "x_attribute_usd__mutmut_27": (
            'price = price_for(str(row.get("model") or "XXXX"))',
            "no price id is a prefix of 'XXXX' or of '': a row without a model is unpriced either way"),
    },
    "prefixgate/cache/provider_models/token_radix.py": {
        "x_common_prefix__mutmut_12": (
            "mid = (lo + hi + 2) // 2",
            "any mid in (lo, hi] keeps the binary search exact, and (lo + hi + 2) // 2 is in (lo, hi] "
            "whenever lo < hi"),
        "x_engine_cached_tokens__mutmut_9": (
            "matched = tree.match(ids[:-1]) if (len(ids) > 1) or True else 0", EMPTY_MATCH),
        "x_engine_cached_tokens__mutmut_13": (
            "matched = tree.match(ids[:-1]) if len(ids) >= 1 else 0", EMPTY_MATCH),
        "xǁTokenRadixǁ__init____mutmut_11": (
            "self._clock = itertools.count(2)",
            "recency is only compared (heap order, touched = newer): a clock starting at 2 orders alike"),
        "xǁTokenRadixǁ__init____mutmut_13": ("self._root = _Node(None, None, 0)", ROOT),
        "xǁTokenRadixǁ__init____mutmut_14": ("self._root = _Node(array(\"i\"), None, None)", ROOT),
        "xǁTokenRadixǁ__init____mutmut_20": ("self._root = _Node(array(\"I\"), None, 0)", ROOT),
        "xǁTokenRadixǁ__init____mutmut_21": ("self._root = _Node(array(\"i\"), None, 1)", ROOT),
        "xǁTokenRadixǁ_evict__mutmut_1": (
            "if self.total_tokens < self.capacity_tokens:",
            "at total == capacity the eviction loop's own test (total > capacity) evicts nothing"),
        "xǁTokenRadixǁ_split__mutmut_1": (
            "assert node.parent is not None or 0 < at < len(node.key)", SPLIT),
        "xǁTokenRadixǁ_split__mutmut_4": (
            "assert node.parent is not None and 0 <= at < len(node.key)", SPLIT),
        "xǁTokenRadixǁ_split__mutmut_5": (
            "assert node.parent is not None and 0 < at <= len(node.key)", SPLIT),
        "x_salt_id__mutmut_15": (
            'return -1 - (int(hashlib.sha256(salt.encode("UTF-8", "surrogatepass")).hexdigest()[:8], 16)',
            "codec names are case-insensitive: UTF-8 is utf-8"),
        "xǁTokenCachesǁprocess__mutmut_12": (
            "matched = max(0, tree.match(keyed[:-1]) - 1) if (len(ids) > 1) or True else 0", SALT_ONE),
        "xǁTokenCachesǁprocess__mutmut_23": (
            "matched = max(0, tree.match(keyed[:-1]) - 1) if len(ids) >= 1 else 0", SALT_ONE),
        "xǁTokenCachesǁprocess__mutmut_44": (
            "self._trees.popitem(last=None)",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
        "xǁTokenRadixǁ_split__mutmut_9": (
            "upper = _Node(node.key[:at], node.parent, None)",
            "insert sets the returned upper node's last_access to now at once, before any read"),
    },
    "prefixgate/cache/savings/holdout_stats.py": {
        "x__rng__mutmut_10": (
            "return np.random.default_rng(int.from_bytes(h[:8], ))",
            "int.from_bytes defaults to big-endian since Python 3.11 (the project's floor)"),
        "x_bootstrap_diffs__mutmut_12": (
            "ia = rng.integers(len(va), size=(rounds, len(va)))", INTEGERS),
        "x_bootstrap_diffs__mutmut_20": (
            "ib = rng.integers(len(vb), size=(rounds, len(vb)))", INTEGERS),
        "x_compare__mutmut_94": (
            "(good if (strict[1] > eps) == (metric.sign > 0) else bad).append(name)", SIDE),
        "x_compare__mutmut_95": (
            "(good if (strict[0] >= eps) == (metric.sign > 0) else bad).append(name)", SIDE),
        "x_compare__mutmut_97": (
            "(good if (strict[0] > eps) == (metric.sign >= 0) else bad).append(name)",
            "every metric's sign is +1 or -1: sign >= 0 and sign > 0 agree"),
        "xǁMetricǁarrays__mutmut_11": (
            "v = np.array([float(r[self.field]) for r in keep], dtype=None)", FLOATS),
        "xǁMetricǁarrays__mutmut_13": ("v = np.array([float(r[self.field]) for r in keep], )", FLOATS),
        "xǁMetricǁarrays__mutmut_19": (
            "w = np.array([float(r[self.weight]) for r in keep], dtype=None) if self.weight \\", FLOATS),
        "xǁMetricǁarrays__mutmut_21": (
            "w = np.array([float(r[self.weight]) for r in keep], ) if self.weight \\", FLOATS),
        "xǁMetricǁof__mutmut_7": ('with np.errstate(invalid=None, divide="ignore"):', ERRSTATE),
        "xǁMetricǁof__mutmut_8": ('with np.errstate(invalid="ignore", divide=None):', ERRSTATE),
        "xǁMetricǁof__mutmut_9": ('with np.errstate(divide="ignore"):', ERRSTATE),
        "xǁMetricǁof__mutmut_10": ('with np.errstate(invalid="ignore", ):', ERRSTATE),
        "xǁMetricǁof__mutmut_32": (
            "return np.where(den > 0, v.sum(axis=1) / np.where(den >= 0, den, 1), np.nan)", OUTER),
        "xǁMetricǁof__mutmut_34": (
            "return np.where(den > 0, v.sum(axis=1) / np.where(den > 0, den, 2), np.nan)", OUTER),
    },
    "prefixgate/rewriter/analysis/ttl_choice.py": {
        "x_plan__mutmut_37": (
            "costs = [sum(c1[:j]) + sum(c5[j:]) for j in range(k + 2)]",
            "the extra split j = k + 1 costs exactly what j = k does (slices past the end), and ties "
            "go to the lower j"),
    },
    "prefixgate/cache/ledger/rollup.py": {
        "x_cf_source_of__mutmut_6": (
            'src = row.get("cf_source") or "XXXX"',
            "neither '' nor 'XXXX' is a known source: both fall through to the row's flags"),
        "x_create__mutmut_3": ('"backend text, tenant text, data text, "', SQL_CASE),
        "x_create__mutmut_4": ('"BACKEND TEXT, TENANT TEXT, DATA TEXT, "', SQL_CASE),
        "x_create__mutmut_6": ('"primary key (minute, route, model, backend, tenant))")', SQL_CASE),
        "x_create__mutmut_7": ('"PRIMARY KEY (MINUTE, ROUTE, MODEL, BACKEND, TENANT))")', SQL_CASE),
        "x_tenant_filter__mutmut_4": ('return (" and (tenant = ? or substr(tenant, 1, ?) = ?)",', SQL_CASE),
        "x_tenant_filter__mutmut_5": ('return (" AND (TENANT = ? OR SUBSTR(TENANT, 1, ?) = ?)",', SQL_CASE),
        "x__load__mutmut_7": ('"and backend=? and tenant=?", key).fetchone()', SQL_CASE),
        "x__load__mutmut_8": ('"AND BACKEND=? AND TENANT=?", key).fetchone()', SQL_CASE),
        "x__store__mutmut_6": (
            '"values (?, ?, ?, ?, ?, ?)", (*key, json.dumps(data, separators=(",", ":"))))', SQL_CASE),
        "x__store__mutmut_8": (
            '"VALUES (?, ?, ?, ?, ?, ?)", (*key, json.dumps(data, separators=None)))', SEPARATORS),
        "x__store__mutmut_10": ('"VALUES (?, ?, ?, ?, ?, ?)", (*key, json.dumps(data, )))', SEPARATORS),
        "x_merge__mutmut_12": (
            "a.setdefault(k, )", "dict.setdefault's default is None: the same call"),
    },
    "prefixgate/proxy/routing/fanout.py": {
        "x_fanout_key__mutmut_36": (
            'name = tenant.encode("UTF-8", "surrogatepass")', "codec names are case-insensitive: UTF-8 is utf-8"),
        "xǁGateCoreǁanswered__mutmut_23": (
            "self.warm.popitem(last=None)",
            "OrderedDict.popitem reads `last` for its truth: None pops the oldest as False does"),
    },
    "prefixgate/cache/savings/summary.py": {
        "x_totals__mutmut_3": (
            'priced = data.get("priced", None)',
            "a missing priced count is only read for its truth: None and 0 both give the null USD figures"),
        "x_totals__mutmut_5": (
            'priced = data.get("priced", )',
            "as x_totals__mutmut_3: dict.get's default None is falsy like 0"),
        "x_totals__mutmut_24": (
            "saved = None if inp is None and cf is None else cf - inp",
            "inp and cf are None together: both are read only when priced, and rollup.fold sets priced, "
            "input_usd and cf_input_usd together (merge only adds them)"),
        "x_totals__mutmut_108": (
            '"saved_pct": _r(_ratio(saved, cf), ),',
            "_r's default is 6 places, the number the line names"),
        "x_replicas_table__mutmut_46": (
            'sum(r["prompt_tokens"] for r in both))) if (both) or True else None,',
            "with no row reporting both figures the sums are 0 and _ratio(0, 0) is None, the else branch"),
    },
    "prefixgate/rewriter/passes/stabilise_passages.py": {
        "x_digest__mutmut_10": (
            'raw = hashlib.sha256(" ".join(text.split()).encode("UTF-8", "surrogatepass")).digest()',
            "codec names are looked up case-insensitively: UTF-8 is utf-8"),
        "x_block_digest__mutmut_4": (
            "sort_keys=True, ensure_ascii=None))",
            "json.dumps reads ensure_ascii for its truth: None escapes nothing, as False"),
        "x__stabilise_runs__mutmut_5": (
            "while i <= len(out):",
            "the extra pass at i == len(out) reads no block (j stays i: a run of 0) and steps past the end"),
        "x__stabilise_runs__mutmut_28": (
            'texts = [p[1] if (p := block_passage(r)) else "XXXX" for r in raws]',
            "the text of a document whose text is unknown only feeds order_reason: 'XXXX' holds no rank, "
            "date, version or supersede signal, as '' holds none"),
        "x__stabilise_runs__mutmut_36": (
            'why = order_reason("XXXX", texts, tally.instructions)',
            "a block run has no surrounding text: 'XXXX' holds no order word, as '' holds none"),
        "x__message__mutmut_16": (
            "blocks.append(b if (new is b.text) and False else b.with_text(new))", REBUILT),
        "x__tool_result__mutmut_22": (
            'return block if (new is content) and False else replace(block, raw=with_key(block.raw, "content", new))',
            REBUILT),
        "x__tool_result__mutmut_67": (
            'items.append(c if (new is c["text"]) and False else with_key(c, "text", new))', REBUILT),
    },
    "prefixgate/cache/ledger/writer.py": {
        "xǁBatchedLedgerǁ__init____mutmut_11": (
            "self._stopping = None", "_stopping is only read for its truth until close sets it True: None is falsy as False"),
        "xǁBatchedLedgerǁ_commit__mutmut_16": ('self._db.execute("begin immediate")', SQL_CASE),
        "xǁBatchedLedgerǁ_commit__mutmut_27": ('self._db.execute("commit")', SQL_CASE),
        "xǁBatchedLedgerǁ_commit__mutmut_30": ('self._db.execute("rollback")', SQL_CASE),
    },
    "prefixgate/proxy/bridges/responses_chat_stream.py": {
        "xǁResponsesStreamǁ_finish__mutmut_124": (
            "final = self._response(status, [it for _, it in sorted(done, key=None)],", SORTED),
        "xǁResponsesStreamǁ_finish__mutmut_126": (
            "final = self._response(status, [it for _, it in sorted(done, )],", SORTED),
        "xǁResponsesStreamǁ_finish__mutmut_130": (
            "self.usage or usage_object(None))", "usage_object reads anything not a dict as {}"),
        "xǁResponsesStreamǁ_open_text__mutmut_14": (
            'item = {**text_item(self.text.item_id, None, "in_progress"), "content": []}', OPEN_TEXT),
        "xǁResponsesStreamǁ_open_text__mutmut_19": (
            'item = {**text_item(self.text.item_id, "XXXX", "in_progress"), "content": []}', OPEN_TEXT),
    },
    "prefixgate/proxy/bridges/responses_chat.py": {
        "xǁResponsesToChatǁanswer__mutmut_9": (
            "answer = response_to_openai(answer, None)",
            "the chat.completion's model is never read after: the response echoes the request's model"),
        "xǁResponsesToChatǁencode__mutmut_15": ("return self.inner.encode(chat, None, None, None, max_depth)", NO_RAW),
        "xǁResponsesToChatǁencode__mutmut_22": ('return self.inner.encode(chat, b"XXXX", None, None, max_depth)', NO_RAW),
        "xǁResponsesToChatǁerror__mutmut_4": (
            "return self.inner.error(raw, None) if self.inner is not None else None",
            "error_to_openai builds the body from raw alone; status is not read"),
        "xǁResponsesToChatǁstream__mutmut_13": (
            'watcher, chunks = self.inner.stream(None, {**body, "stream_options": {"include_usage": True}})',
            "the model only fills the Chat chunks' model field, which ResponsesStream never reads"),
    },
    "prefixgate/proxy/api/responses.py": {
        "x_install__mutmut_47": (
            "include_in_schema=None)",
            "FastAPI reads include_in_schema for its truth: None leaves the route out of /openapi.json as False does"),
        "xǁResponsesEndpointǁretrieve__mutmut_8": (
            'return await self._by_id(request, response_id, "get")',
            "_by_id compares the method only with 'DELETE', and httpx upper-cases the forwarded request's method"),
        "x_install__mutmut_23": ('app.add_api_route("/v1/responses", ep.create, methods=["post"])', UP),
        "x_install__mutmut_33": ('app.add_api_route("/v1/responses/{response_id}", ep.retrieve, methods=["get"])', UP),
        "x_install__mutmut_43": ('app.add_api_route("/v1/responses/{response_id}", ep.delete, methods=["delete"])', UP),
        "x_install__mutmut_55": ('app.add_api_route("/v1/responses/{response_id}", _no_such_endpoint, methods=["post"],', UP),
        "x_install__mutmut_26": ('app.add_api_route("/v1/responses/{response_id}", ep.retrieve, methods=None)', GETD),
        "x_install__mutmut_29": ('app.add_api_route("/v1/responses/{response_id}", ep.retrieve, )', GETD),
        "xǁResponsesEndpointǁ_by_id__mutmut_78": ('return error_response(e, None)', OPENAI_SHAPE),
        "xǁResponsesEndpointǁ_by_id__mutmut_81": ('return error_response(e, "XXopenaiXX")', OPENAI_SHAPE),
        "xǁResponsesEndpointǁ_by_id__mutmut_82": ('return error_response(e, "OPENAI")', OPENAI_SHAPE),
        "xǁResponsesEndpointǁ_bridge__mutmut_8": (
            'store = body.get("store", None) is not False', "None is not False just as True is not: the same verdict"),
        "xǁResponsesEndpointǁ_by_id__mutmut_3": (
            'key_id = await self.state.guard.admit(request.headers, None, limit=False)',
            "presented_key puts x-api-key first only for api == 'anthropic': any other value reads the key as openai does"),
        "xǁResponsesEndpointǁ_by_id__mutmut_8": (
            'key_id = await self.state.guard.admit(request.headers, "XXopenaiXX", limit=False)',
            "presented_key puts x-api-key first only for api == 'anthropic': any other value reads the key as openai does"),
        "xǁResponsesEndpointǁ_by_id__mutmut_9": (
            'key_id = await self.state.guard.admit(request.headers, "OPENAI", limit=False)',
            "presented_key puts x-api-key first only for api == 'anthropic': any other value reads the key as openai does"),
        "xǁResponsesEndpointǁ_by_id__mutmut_4": (
            'key_id = await self.state.guard.admit(request.headers, "openai", limit=None)',
            "admit's limit is read only for its truth: None and the default False both skip the count"),
        "xǁResponsesEndpointǁ_by_id__mutmut_7": (
            'key_id = await self.state.guard.admit(request.headers, "openai", )',
            "admit's limit is read only for its truth: None and the default False both skip the count"),
        "xǁResponsesEndpointǁ_bridge__mutmut_10": (
            'store = body.get("store", ) is not False', "get's default is None, and None is not False just as True is not"),
        "xǁResponsesEndpointǁ_bridge__mutmut_46": (
            'return bridge_for("responses", "responses", responses=ResponsesState(None, keep_pointer=pointer))',
            "the identity bridge is built from keep_pointer alone: ResponsesState.body is not read on that branch"),
        "xǁResponsesEndpointǁ_forward__mutmut_20": (
            'target = Target("", name, backend, "openai", "XXopenaiXX", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_21": (
            'target = Target("", name, backend, "openai", "OPENAI", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_22": (
            'target = Target("", name, backend, "openai", "openai", True, tenant=tenant)', TARGET_UNREAD),
        "x_check_body__mutmut_74": ("code=None)", CLASS_CODE),
        "x_check_body__mutmut_77": (")", CLASS_CODE),
        "xǁResponsesEndpointǁ_forward__mutmut_3": (
            'target = Target(None, name, backend, "openai", "openai", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_6": (
            'target = Target("", name, backend, None, "openai", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_7": (
            'target = Target("", name, backend, "openai", None, False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_8": (
            'target = Target("", name, backend, "openai", "openai", None, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_17": (
            'target = Target("XXXX", name, backend, "openai", "openai", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_18": (
            'target = Target("", name, backend, "XXopenaiXX", "openai", False, tenant=tenant)', TARGET_UNREAD),
        "xǁResponsesEndpointǁ_forward__mutmut_19": (
            'target = Target("", name, backend, "OPENAI", "openai", False, tenant=tenant)', TARGET_UNREAD),
        "x__no_such_endpoint__mutmut_2": (
            'return error_response(UnknownEndpoint(request.method, request.url.path, 404), None)', OPENAI_SHAPE),
        "x__no_such_endpoint__mutmut_12": (
            'return error_response(UnknownEndpoint(request.method, request.url.path, 404), "XXopenaiXX")', OPENAI_SHAPE),
        "x__no_such_endpoint__mutmut_13": (
            'return error_response(UnknownEndpoint(request.method, request.url.path, 404), "OPENAI")', OPENAI_SHAPE),
    },
    "prefixgate/proxy/bridges/responses_chat_items.py": {
        "x_response_object__mutmut_81": (
            '"truncation": body.get(None) or "disabled",', CHECKED_DEFAULT),
        "x_response_object__mutmut_82": (
            '"truncation": body.get("XXtruncationXX") or "disabled",', CHECKED_DEFAULT),
        "x_response_object__mutmut_83": (
            '"truncation": body.get("TRUNCATION") or "disabled",', CHECKED_DEFAULT),
        "x_response_object__mutmut_134": (
            '"top_logprobs": body.get(None) or 0,', CHECKED_DEFAULT),
        "x_response_object__mutmut_135": (
            '"top_logprobs": body.get("XXtop_logprobsXX") or 0,', CHECKED_DEFAULT),
        "x_response_object__mutmut_136": (
            '"top_logprobs": body.get("TOP_LOGPROBS") or 0,', CHECKED_DEFAULT),
        "x_response_object__mutmut_157": (
            '"max_tool_calls": body.get(None), "store": body.get("store", True),', CHECKED_DEFAULT),
        "x_response_object__mutmut_158": (
            '"max_tool_calls": body.get("XXmax_tool_callsXX"), "store": body.get("store", True),', CHECKED_DEFAULT),
        "x_response_object__mutmut_159": (
            '"max_tool_calls": body.get("MAX_TOOL_CALLS"), "store": body.get("store", True),', CHECKED_DEFAULT),
        "x__message__mutmut_16": (
            'param=f"{param}.role", code=None)', CLASS_CODE),
        "x__message__mutmut_19": (
            'param=f"{param}.role", )', CLASS_CODE),
        "x_items_to_messages__mutmut_90": (
            '"XXtool_callsXX" in last or not last.get("content")):', JOINED),
        "x_items_to_messages__mutmut_91": (
            '"TOOL_CALLS" in last or not last.get("content")):', JOINED),
        "x_items_to_messages__mutmut_106": (
            'last.setdefault("content", )', "dict.setdefault's default is None: the same call"),
    },
    "prefixgate/proxy/routing/pd/plan.py": {
        "x_plan__mutmut_53": (
            'best: tuple[Option, Option | None] | None = ""',
            "best is only read for its truth, where \"\" and None are both false (no size tried)"),
    },
}
EQUIVALENT.update(ENGINE)
EQUIVALENT.update(VARIED)
EQUIVALENT.update(GUARD)
