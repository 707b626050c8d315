"""Equivalent mutants of the modules issue 38 added to the mutation targets (count_tokens,
stand_back, ...; :mod:`mutation.equivalents` holds the shape and the rest): the mutant's name ->
(the mutated line as its diff shows it, the one-line reason)."""

from __future__ import annotations

NO_LEDGER = ("count_tokens' endpoint writes no ledger row (ledger=False): the row's status and endpoint are "
             "read by state.record only, never called here; ex.record's own test (status != 'ok') is true "
             "for 'estimated', None and any other text alike")
SETTLED_200 = ("a count request's ticket charges no tokens (prepare calls Guard.limit with count_tokens = the "
               "endpoint's ledger flag, False): Guard.settle returns before it reads http_status")
COUNT_BRIDGE = ("the count bridge is built with passes=False (no pass API whatever the client name); its "
                "wire picks the usage parser (a {input_tokens} answer has no usage in either shape), the "
                "stream watcher (the endpoint never streams) and the salt (openai only): any other name acts "
                "as 'anthropic'")
ANY_MODEL = ("a missing model names no o200k prefix whether it reads '', 'None' or 'XXXX': cl100k_base each "
             "time (and the endpoint's check requires a model string, so the default is never read there)")
SHIELD_404 = ("differs only if the client's cancellation lands inside aclose() of the unread 404 body (a socket "
              "close with no wait on the peer): no test can place a cancellation there; not strictly "
              "equivalent, recorded as untestable")

SETTINGS_FIELD = ("RewriteSettings always has tool_schema_sort_properties (a pydantic field, default False): "
                  "getattr's default is never read")

DUMP = ("_dump's text is only compared with another _dump text or hashed into a digest compared with digests "
        "of the same function: escaping non-ASCII changes both sides alike (the bytes sent are not _dump's)")

TOUCH = ("two spans never touch: every span ends before a non-word character (lookaheads, \\b, (?!id char)) and "
         "every span starts at a word character or, for labelled_id, right after its label's separator, which "
         "no other span ends on")
CUT_ZERO = ("the cut lies in [pos + size // 2, end): it is 0 only at pos 0 with size 1, where cut + 1 = 1 = end "
            "either way")
LINE_START = ("the search starts one or two characters earlier (the newline, the previous line's last character): "
              "no PER_REQUEST word is one character long or matches across a newline")
LINE_END = "a newline found from span.end >= 1 on is never at index 0: b < 0, <= 0 and < 1 agree"

SIZE_UNREAD = "size is read only to estimate tokens, which count_tokens=False skips"
SAME_WINDOW = ("this branch runs only when the limiter's current window is the ticket's: the current one (None, "
               "the default) is that window")

OWN_WATCHER = ("the watcher the relay hands back is the one this bridge's stream() made, a ResponsesWatcher, "
               "which always has last_seq and response_id: getattr's default is never read")

LEVELS_DEFAULT = ("ScreenedHead's levels=None is cpu_levels() (its first line): passing None or nothing is passing "
                  "cpu_levels()")
FIRST_CALL = ("overwritten before first use: screen() calls _outliers first, whose first call is call 1, in "
              "REFRESH_AT, which sets chans, w_chans and keep_mask from the inputs")
NEG_INF = "float() parses 'inf' case-insensitively: float('-INF') is float('-inf')"
ROUND_BOUNDED = ("q = round(xs / d) with d = max|xs| / L is within [-L, L] already (|xs_i| <= max|xs|; a quotient "
                 "of L(1 + 2u) rounds to L); where max|xs| = 0 every q is 0: the clamp never bites on either side")
QPARAMS = ("the kernel's dynamic quantization reads only the min and max of the whole input: an extra zero row, "
           "or -L in another column of the sentinel row (hidden >= 3; SmolLM2 576), leaves both as they are")

VARIED: dict[str, dict[str, tuple[str, str]]] = {
    "prefixgate/proxy/api/count_tokens.py": {
        "x__bridge__mutmut_6": ('return Bridge(None, "anthropic", COUNT_TOKENS.path, passes=False)', COUNT_BRIDGE),
        "x__bridge__mutmut_7": ('return Bridge("anthropic", None, COUNT_TOKENS.path, passes=False)', COUNT_BRIDGE),
        "x__bridge__mutmut_9": ('return Bridge("anthropic", "anthropic", COUNT_TOKENS.path, passes=None)',
                                "passes is read only for its truth (pass_api): None is False"),
        "x__bridge__mutmut_14": ('return Bridge("XXanthropicXX", "anthropic", COUNT_TOKENS.path, passes=False)',
                                 COUNT_BRIDGE),
        "x__bridge__mutmut_15": ('return Bridge("ANTHROPIC", "anthropic", COUNT_TOKENS.path, passes=False)',
                                 COUNT_BRIDGE),
        "x__bridge__mutmut_16": ('return Bridge("anthropic", "XXanthropicXX", COUNT_TOKENS.path, passes=False)',
                                 COUNT_BRIDGE),
        "x__bridge__mutmut_17": ('return Bridge("anthropic", "ANTHROPIC", COUNT_TOKENS.path, passes=False)',
                                 COUNT_BRIDGE),
        "x__bridge__mutmut_19": ("raise NoCounter(None)",
                                 "NoCounter is caught in count_tokens and answered with the estimate: its "
                                 "message is never read"),
        "x_count_tokens__mutmut_6": ("ex = Exchange(COUNT_TOKENS, LedgerRow(endpoint=None))", NO_LEDGER),
        "x_count_tokens__mutmut_22": ('ex.record(state, None, 200)', NO_LEDGER),
        "x_count_tokens__mutmut_23": ('ex.record(state, "estimated", None)', SETTLED_200),
        "x_count_tokens__mutmut_27": ('ex.record(state, "XXestimatedXX", 200)', NO_LEDGER),
        "x_count_tokens__mutmut_28": ('ex.record(state, "ESTIMATED", 200)', NO_LEDGER),
        "x_count_tokens__mutmut_29": ('ex.record(state, "estimated", 201)', SETTLED_200),
        "x_count_tokens__mutmut_41": ("with anyio.CancelScope(shield=None):", SHIELD_404),
        "x_count_tokens__mutmut_42": ("with anyio.CancelScope(shield=False):", SHIELD_404),
        "x_count_tokens__mutmut_44": ('ex.record(state, None, 200)', NO_LEDGER),
        "x_count_tokens__mutmut_45": ('ex.record(state, "estimated", None)', SETTLED_200),
        "x_count_tokens__mutmut_49": ('ex.record(state, "XXestimatedXX", 200)', NO_LEDGER),
        "x_count_tokens__mutmut_50": ('ex.record(state, "ESTIMATED", 200)', NO_LEDGER),
        "x_count_tokens__mutmut_51": ('ex.record(state, "estimated", 201)', SETTLED_200),
        "x_estimate__mutmut_6": ('count = make_counter(encoding_for_model(str(body.get("model", None))))', ANY_MODEL),
        "x_estimate__mutmut_8": ('count = make_counter(encoding_for_model(str(body.get("model", ))))', ANY_MODEL),
        "x_estimate__mutmut_11": ('count = make_counter(encoding_for_model(str(body.get("model", "XXXX"))))',
                                  ANY_MODEL),
        "x_install__mutmut_14": ('app.add_api_route("/v1/messages/count_tokens", handler, methods=["post"])',
                                 "FastAPI upper-cases a route's methods (route.methods == {'POST'}): 'post' is 'POST'"),
    },
    "prefixgate/cache/savings/stand_back.py": {
        "xǁRouteJudgeǁ_route__mutmut_1": ('def _route(self, route: str, tenant: str = "XXXX") -> _Route:',
                                          "every caller (observe, verdict) passes the tenant: the default is "
                                          "never read"),
        "xǁRouteJudgeǁ_route__mutmut_14": ("self._routes.popitem(last=None)",
                                           "OrderedDict.popitem reads `last` for its truth: None pops the oldest "
                                           "as False does"),
        "xǁVerdictǁsummary__mutmut_8": (
            'return f"{\',\'.join(self.passes)}: {self.reason}".encode("ASCII", "replace").decode()',
            "codec names are case-insensitive: ASCII is ascii"),
    },
    "prefixgate/rewriter/passes/canonicalize_tools.py": {
        "x__perm_from_token__mutmut_15": ("else [_PERM_DIGITS.rindex(c) for c in token])",
                                          "every digit occurs once in _PERM_DIGITS: rindex is index"),
        "x__dump__mutmut_2": ("return json.dumps(v, ensure_ascii=None)", DUMP),
        "x__dump__mutmut_4": ("return json.dumps(v, )", DUMP),
        "x__dump__mutmut_5": ("return json.dumps(v, ensure_ascii=True)", DUMP),
        "x_with_key_order__mutmut_3": (
            'tokens = code.split("/") if (code) or True else []',
            "an empty code then gives [''] where [] was: '' is the identity token a missing one stands for, "
            "and a value without objects comes back equal either way (rebuilt or as it is)"),
        "x_run__mutmut_119": ("tokens = ctx.count_tokens(json.dumps([t.raw for t in canon], ensure_ascii=None))",
                              "json.dumps reads ensure_ascii for its truth: None is False"),
        "x_run__mutmut_34": ('sort_props = bool(getattr(ctx.settings, "tool_schema_sort_properties", None))',
                             SETTINGS_FIELD),
        "x_run__mutmut_37": ('sort_props = bool(getattr(ctx.settings, "tool_schema_sort_properties", ))',
                             SETTINGS_FIELD),
        "x_run__mutmut_40": ('sort_props = bool(getattr(ctx.settings, "tool_schema_sort_properties", True))',
                             SETTINGS_FIELD),
    },
    "prefixgate/rewriter/analysis/volatile_spans.py": {
        "x_find_spans__mutmut_2": ("if len(text) < MEMO_MAX_CHARS:",
                                   "the memo only caches _find_spans: a text of exactly MEMO_MAX_CHARS gets the "
                                   "same spans scanned or memoized"),
        "x__has_digit__mutmut_8": ("return any(text.rfind(d, a, b) >= 0 for d in \"0123456789\")",
                                   "rfind finds a digit in the window exactly when find does"),
        "x__find_spans__mutmut_27": ("if e >= s and not _is_example(text, m.start()):",
                                     "no detector's span (group v or the match) can be empty: each needs digits"),
        "x__find_spans__mutmut_43": ("found.sort(key=lambda sp: (sp.start, -(sp.end + sp.start)))",
                                     "the second key only orders spans of one start, where -(end + start) and "
                                     "-(end - start) differ by the same 2 * start"),
        "x__find_spans__mutmut_46": ("if out and sp.start <= out[-1].end:", TOUCH),
        "x_windows__mutmut_29": ("end = cut + 1 if cut > 0 else end", CUT_ZERO),
        "x_windows__mutmut_30": ("end = cut + 1 if cut >= 1 else end", CUT_ZERO),
        "x_per_request__mutmut_20": ("a = lo if nl <= 0 else nl + 1", LINE_START),
        "x_per_request__mutmut_21": ("a = lo if nl < 1 else nl + 1", LINE_START),
        "x_per_request__mutmut_22": ("a = lo if nl < 0 else nl - 1", LINE_START),
        "x_per_request__mutmut_42": ("b = min(len(text), span.end + LINE_REACH) if b <= 0 else b", LINE_END),
        "x_per_request__mutmut_43": ("b = min(len(text), span.end + LINE_REACH) if b < 1 else b", LINE_END),
    },
    "prefixgate/proxy/http/auth.py": {
        "x_new_key__mutmut_2": ("return KEY_PREFIX + secrets.token_urlsafe(None)",
                                "secrets.token_urlsafe's default is 32 bytes, the number the line names"),
        "x_basic_password__mutmut_9": ('decoded = base64.b64decode(token.strip(), validate=True).decode("UTF-8")',
                                       "codec names are case-insensitive: UTF-8 is utf-8"),
        "x_basic_password__mutmut_16": ('return password.strip() if (colon) or True else ""',
                                        "without a colon str.partition leaves the password empty: '' either way"),
        "x_presented_key__mutmut_8": ('bearer = headers.get("authorization", "XXXX")',
                                      "a missing header's default names no scheme either way ('XXXX' is neither "
                                      "bearer nor basic): no key from it"),
        "xǁGuardǁ_key__mutmut_2": (
            "return next((k for k in self.store.keys() if k.id == key_id), None) if (key_id) or True else None",
            "no stored key has the id '' (KEY_ID_PATTERN): the search finds None as the else branch says"),
        "xǁGuardǁadmit__mutmut_33": ("await self.limit(found.id, None, 0, count_tokens=None)",
                                     "count_tokens is read for its truth only (counts, Ticket.tokens): None is False"),
        "xǁGuardǁadmit__mutmut_32": ("await self.limit(found.id, None, None, count_tokens=False)", SIZE_UNREAD),
        "xǁGuardǁadmit__mutmut_38": ("await self.limit(found.id, None, 1, count_tokens=False)", SIZE_UNREAD),
        "xǁGuardǁsettle__mutmut_14": ("self._open.pop(ticket.key_id, )",
                                      "the key is in _open (open_ was just read from it): pop needs no default"),
        "xǁGuardǁsettle__mutmut_46": ("self.limiter.add_tokens(ticket.key_id, delta, None)", SAME_WINDOW),
        "xǁGuardǁsettle__mutmut_49": ("self.limiter.add_tokens(ticket.key_id, delta, )", SAME_WINDOW),
        "xǁGuardǁsettle__mutmut_50": ("elif delta >= 0:  # spent now: counts in the window it is spent in",
                                      "a delta of 0 adds nothing: add_tokens returns at once for 0 tokens"),
    },
    "prefixgate/proxy/bridges/responses_identity.py": {
        "x__input_excerpt__mutmut_33": (
            "parts.append(t[:VIEW_INPUT_CHARS + seen])",
            "a part kept longer than what is left only adds characters past the bound in the joined text, "
            "which the final [:VIEW_INPUT_CHARS] cuts; seen still reaches the bound at the same item"),
        "xǁResponsesIdentityǁend_mapper__mutmut_38": (
            '"sequence_number": getattr(watcher, "last_seq", None) + 1}', OWN_WATCHER),
        "xǁResponsesIdentityǁend_mapper__mutmut_41": ('"sequence_number": getattr(watcher, "last_seq", ) + 1}',
                                                      OWN_WATCHER),
        "xǁResponsesIdentityǁend_mapper__mutmut_44": ('"sequence_number": getattr(watcher, "last_seq", +1) + 1}',
                                                      OWN_WATCHER),
        "xǁResponsesIdentityǁend_mapper__mutmut_45": ('"sequence_number": getattr(watcher, "last_seq", -2) + 1}',
                                                      OWN_WATCHER),
        "xǁResponsesIdentityǁstream_done__mutmut_4": ('rid = getattr(watcher, "response_id", None)', OWN_WATCHER),
        "xǁResponsesIdentityǁstream_done__mutmut_7": ('rid = getattr(watcher, "response_id", )', OWN_WATCHER),
        "xǁResponsesIdentityǁstream_done__mutmut_10": ('rid = getattr(watcher, "response_id", "XXXX")', OWN_WATCHER),
    },
    "prefixgate/local_engine/model/quant/screened_head.py": {
        "x_attach__mutmut_8": ("model._argmax_head = ScreenedHead(w, full, None)", LEVELS_DEFAULT),
        "x_attach__mutmut_11": ("model._argmax_head = ScreenedHead(w, full, )", LEVELS_DEFAULT),
        "xǁScreenedHeadǁ__init____mutmut_31": ("self.packed = torch.ops.quantized.linear_prepack(q, )",
                                               "linear_prepack's bias defaults to None"),
        "xǁScreenedHeadǁ__init____mutmut_54": ("self.sentinel = torch.zeros(2, w.shape[1])", QPARAMS),
        "xǁScreenedHeadǁ__init____mutmut_60": ("self.sentinel[0, 0], self.sentinel[0, 2] = levels + 1, -levels",
                                               QPARAMS),
        "xǁScreenedHeadǁ__init____mutmut_77": ("self.chans = None", FIRST_CALL),
        "xǁScreenedHeadǁ__init____mutmut_79": ("self.w_chans = None", FIRST_CALL),
        "xǁScreenedHeadǁ__init____mutmut_84": ("self.keep_mask[: self.num_outliers] = 1.0", FIRST_CALL),
        "xǁScreenedHeadǁ_proven__mutmut_17": ('ninf = value.new_full((rows,), float("-INF"))', NEG_INF),
        "xǁScreenedHeadǁ_proven__mutmut_65": (
            'other_hi = ninf.scatter_reduce(0, row, hi.masked_fill(at_best, float("-INF")), "amax")', NEG_INF),
        "xǁScreenedHeadǁscreen__mutmut_17": ("q = torch.round(xs / d).clamp_(None, lv)", ROUND_BOUNDED),
        "xǁScreenedHeadǁscreen__mutmut_18": ("q = torch.round(xs / d).clamp_(-lv, None)", ROUND_BOUNDED),
        "xǁScreenedHeadǁscreen__mutmut_20": ("q = torch.round(xs / d).clamp_(-lv, )", ROUND_BOUNDED),
    },
}
