"""Equivalent mutants of the engine's modules (:mod:`mutation.equivalents` holds the shape
and the rest): the mutant's name -> (the mutated line as its diff shows it, the one-line reason)."""

from __future__ import annotations

CPU_RAND = ("torch.rand's default device is the CPU, where p is on this box (no GPU here: on a CUDA engine "
            "the draw would follow the generator's device)")
RESIDUAL = ("unreachable else: max(0, p - q) sums to 0 only when p <= q everywhere, i.e. p = q, where the "
            "ratio is 1 and x was accepted (a deterministic drafter: p(x) = 1 likewise)")
PAUSE_COUNT = ("from the first estimate 0.7 the EMA is >= 0.7^4 = 0.24 for three drafts and first falls under "
               "0.15 at the fifth (0.118), so the drafts test (>= 4, > 4, >= 5, counting by 2) never decides")
CLAMP = ("the non-CPU weights' clamp never binds: s = max|W[o, :]| / 127, so |W / s| <= 127 and rounds "
         "into [-127, 127] whatever the bounds (the CPU path quantizes with torch's own kernel)")
FREED = ("the freed float weight is never read again (the products hold their own copies): an empty "
         "Parameter from None / no data, or one with requires_grad, frees it the same way at inference")
VNNI_DEFAULT = ("linear_dynamic's reduce_range defaults to False, which is what this CPU (avx512_vnni) uses; "
                "on a CPU without VNNI the activations would be 8-bit instead of 7-bit (rounding only)")
RUNNING_COMPUTED = ("a running request has computed at least its first chunk (admission schedules one in the "
                    "same step), so num_computed > 0 whenever it is running")
ONE_LEFT = ("a running request with one token to compute is a decode (num_computed > 0, see RUNNING_COMPUTED) "
            "or one cut by decodes[:budget], which leaves no budget: the loop skipped it already")
CACHED_UNREAD = ("`cached` is read only by _should_defer, which returns before reading it without a cache, "
                 "and with a cache it is overwritten by the peek")
LOG_LEVEL = ("log_level only sets llguidance's own stderr tracing: at 0 and at 1 (the default) it prints "
             "nothing, for a grammar that compiles and for one that fails (checked)")
ASCII = ("llguidance reads the %json body as JSON: a \\u00fc escape and the raw character are the same "
         "schema (test_a_non_ascii_const_is_kept_as_written passes either way)")
CPU_DEVICE = ("on the CPU (no accelerator here) .to(None) leaves the mask where .to(logits.device) puts it; "
              "on CUDA it differs: test_the_mask_follows_the_logits_device (skipped without CUDA) kills it")


ENGINE: dict[str, dict[str, tuple[str, str]]] = {
    "prefixgate/local_engine/spec/decode.py": {
        "x_verify_greedy__mutmut_3": (
            "target = logits.argmax(dim=+1).tolist()", "logits are 2-D [k + 1, V]: dim +1 is dim -1"),
        "x_expected_tokens__mutmut_1": (
            "if k < 0:", "at k = 0 the series gives 1 + a (1 - a^0) / (1 - a) = 1 (and k + 1 = 1 for a >= 1)"),
        "x_interpolate__mutmut_1": (
            "if rows < curve[0][0]:",
            "at the first point's rows the first segment (or a one-point curve's flat tail) answers c0 too"),
        "x_choose_k_cap__mutmut_11": (
            "for cap in range(k_max + 1):",
            "cap 0 drafts nothing: its rate is plain decoding's, which a cap must beat by 10 % to be taken"),
        "xǁSpecDecoderǁpropose__mutmut_12": (
            "if self.cost_curve is not None and allowance >= 0:",
            "with no spare rows every share is 0 and nothing is drafted whatever the cap"),
        "xǁSpecDecoderǁpropose__mutmut_38": (
            "share = allowance // (len(decodes) - i) if allowance > len(decodes) - i else (",
            "when the allowance equals the requests left, allowance // left is 1, as the else branch gives"),
        "x_verify_sampled__mutmut_17": (
            "ratio = px if q is None else min(2.0, px / max(float(q[x]), 1e-20))",
            "u is in [0, 1): a ratio capped at 2 passes u < ratio exactly when one capped at 1 does"),
        "x_verify_sampled__mutmut_29": ("u = float(torch.rand(1, generator=gen, device=None).item())", CPU_RAND),
        "x_verify_sampled__mutmut_32": ("u = float(torch.rand(1, generator=gen, ).item())", CPU_RAND),
        "x_verify_sampled__mutmut_34": (
            "if u <= ratio:", "differs only when the uniform equals the ratio exactly (p(x) = 0 and u = 0.0)"),
        "x_verify_sampled__mutmut_48": (
            "nxt = _draw(residual / total, gen) if (total > 0) or True else _draw(p, gen)", RESIDUAL),
        "x_verify_sampled__mutmut_53": (
            "nxt = _draw(residual * total, gen) if total > 0 else _draw(p, gen)",
            "torch.multinomial normalises its weights: residual * total draws as residual / total"),
        "x_verify_sampled__mutmut_54": (
            "nxt = _draw(residual / total, gen) if total >= 0 else _draw(p, gen)", RESIDUAL),
        "x_verify_sampled__mutmut_56": (
            "nxt = _draw(residual / total, gen) if total > 0 else _draw(None, gen)", RESIDUAL),
        "x_verify_sampled__mutmut_57": (
            "nxt = _draw(residual / total, gen) if total > 0 else _draw(p, None)", RESIDUAL),
        "x_verify_sampled__mutmut_58": (
            "nxt = _draw(residual / total, gen) if total > 0 else _draw(gen)", RESIDUAL),
        "x_verify_sampled__mutmut_59": (
            "nxt = _draw(residual / total, gen) if total > 0 else _draw(p, )", RESIDUAL),
        "xǁSpecDecoderǁ__init____mutmut_20": (
            "self.suffix_indexes: list[Any] = None  # suffix_index.SuffixIndex, for stats()",
            "stats() reads the list for its truth (None and [] both: no index) and spec/factory.py assigns it"),
        "xǁSpecDecoderǁverify__mutmut_56": (
            "st.k = min(self.k_max, st.k + 1) if (m == k) and False else max(1, m + 1)",
            "after a full acceptance m + 1 = k + 1, and propose drafts min(st.k, cap) with cap <= k_max"),
        "xǁSpecDecoderǁverify__mutmut_88": ("st.drafts += 2", PAUSE_COUNT),
        "xǁSpecDecoderǁverify__mutmut_90": ("if st.drafts > 4 and st.ema < PAUSE_BELOW:", PAUSE_COUNT),
        "xǁSpecDecoderǁverify__mutmut_91": ("if st.drafts >= 5 and st.ema < PAUSE_BELOW:", PAUSE_COUNT),
        "xǁSpecDecoderǁverify__mutmut_92": (
            "if st.drafts >= 4 and st.ema <= PAUSE_BELOW:", "differs only when the estimate is exactly 0.15"),
    },
    "prefixgate/local_engine/model/quant/int8.py": {
        "x__full_precision__mutmut_2": (
            "if cpu_linear.available(weight.device, None):",
            "the kept product falls back to F.linear: the same fp32 product summed in another order (speed only)"),
        "x_calibration_ids__mutmut_8": (
            "return torch.randint(vocab_size, (n,), generator=g).tolist()",
            "torch.randint(high, size) is randint(0, high, size): the same draws from the same generator"),
        "x_quantize_model__mutmut_35": (
            "if (outlier_channels) or True else {}",
            "with outlier_channels 0 the calibration prefill runs but its stats pick topk(0): no channel, "
            "and Int8Linear takes an empty selection as none (plain int8); costs one prefill, changes no product"),
        "x_quantize_model__mutmut_101": ("mod.weight = torch.nn.Parameter(None, requires_grad=False)", FREED),
        "x_quantize_model__mutmut_103": ("mod.weight = torch.nn.Parameter(requires_grad=False)", FREED),
        "x_quantize_model__mutmut_104": ("mod.weight = torch.nn.Parameter(torch.empty(0), )", FREED),
        "x_quantize_model__mutmut_107": ("mod.weight = torch.nn.Parameter(torch.empty(0), requires_grad=True)", FREED),
        "x_quantize_model__mutmut_110": ("model.lm_head.weight = torch.nn.Parameter(None, requires_grad=False)", FREED),
        "x_quantize_model__mutmut_112": ("model.lm_head.weight = torch.nn.Parameter(requires_grad=False)", FREED),
        "x_quantize_model__mutmut_113": ("model.lm_head.weight = torch.nn.Parameter(torch.empty(0), )", FREED),
        "x_quantize_model__mutmut_116": (
            "model.lm_head.weight = torch.nn.Parameter(torch.empty(0), requires_grad=True)", FREED),
        "xǁInt8Linearǁ__call____mutmut_13": (
            "y = torch.ops.quantized.linear_dynamic(xs, self.packed, None)", VNNI_DEFAULT),
        "xǁInt8Linearǁ__call____mutmut_16": ("y = torch.ops.quantized.linear_dynamic(xs, self.packed, )", VNNI_DEFAULT),
        "xǁInt8Linearǁ__call____mutmut_31": (
            "y = torch.ops.quantized.linear_dynamic(xs / r, self.packed, None) * r", VNNI_DEFAULT),
        "xǁInt8Linearǁ__call____mutmut_34": (
            "y = torch.ops.quantized.linear_dynamic(xs / r, self.packed, ) * r", VNNI_DEFAULT),
        "xǁInt8Linearǁ__call____mutmut_23": (
            "r = xs.abs().amax(dim=+1, keepdim=True).clamp_min(1e-12)", "x is 2-D [T, in]: dim +1 is dim -1"),
        "xǁInt8Linearǁ__call____mutmut_7": (
            "if xf.shape[0] == 1:  # one row: the per-tensor scale is already per token".replace(
                "xf.shape[0]", "xf.shape[1]"),
            "one row through the per-token path is the per-tensor product (r is its own scale), rescaled"),
        "xǁInt8Linearǁ__call____mutmut_52": (
            "return y if (y.dtype == x.dtype) and False else y.to(x.dtype)", "Tensor.to(its own dtype) is a no-op"),
        "xǁInt8Linearǁ__init____mutmut_62": (
            "self.qweight = torch.round(w / self.scale[:, None]).clamp(None, 127).to(torch.int8)", CLAMP),
        "xǁInt8Linearǁ__init____mutmut_63": (
            "self.qweight = torch.round(w / self.scale[:, None]).clamp(-127, None).to(torch.int8)", CLAMP),
        "xǁInt8Linearǁ__init____mutmut_65": (
            "self.qweight = torch.round(w / self.scale[:, None]).clamp(-127, ).to(torch.int8)", CLAMP),
        "xǁInt8Linearǁ__init____mutmut_69": (
            "self.qweight = torch.round(w / self.scale[:, None]).clamp(-128, 127).to(torch.int8)", CLAMP),
        "xǁInt8Linearǁ__init____mutmut_70": (
            "self.qweight = torch.round(w / self.scale[:, None]).clamp(-127, 128).to(torch.int8)", CLAMP),
        "xǁInt8Linearǁ__init____mutmut_56": (
            "self.packed = torch.ops.quantized.linear_prepack(q, )", "linear_prepack's bias defaults to None"),
    },
    "prefixgate/local_engine/sched/scheduler.py": {
        "xǁSchedulerǁcomplete_step__mutmut_9": (
            "self.kv.cache_seq(seq, finished=None)",
            "KVManager.cache_seq reads `finished` for its truth: None takes the running branch as False"),
        "xǁSchedulerǁschedule__mutmut_6": (
            "decodes = [s for s in self.running if s.num_uncomputed == 1 and s.num_computed >= 0]",
            RUNNING_COMPUTED),
        "xǁSchedulerǁschedule__mutmut_40": ("if s.num_uncomputed <= 1:", ONE_LEFT),
        "xǁSchedulerǁschedule__mutmut_41": ("if s.num_uncomputed < 2:", ONE_LEFT),
        "xǁSchedulerǁschedule__mutmut_42": (
            "break", "unreachable: a running request always has a token to compute when schedule() runs "
                     "(each step ends with its sampled token appended, or the request finished)"),
        "xǁSchedulerǁschedule__mutmut_96": ("cached = None", CACHED_UNREAD),
        "xǁSchedulerǁschedule__mutmut_97": ("cached = 1", CACHED_UNREAD),
        "xǁSchedulerǁschedule__mutmut_105": (
            "cached = self.cache.peek_prefix_len(seq.token_ids[:-2], seq.extra_key)",
            "differs only when the match covers all of token_ids[:-1]; the shared prefix is then at most "
            "the match, so shared - cached <= 1 < 32 either way: no deferral"),
    },
    "prefixgate/local_engine/server/constrained.py": {
        "x_call_schema__mutmut_7": (
            "params = _bounded(copy.copy(parameters), max_string)",
            "_bounded builds a new dict at every level it rewrites and mutates nothing, and the $defs "
            "pop acts on its output: the client's schema is untouched either way"),
        "x_tool_call_grammar__mutmut_18": (
            'rules.append(f"call_{i}: %json {json.dumps(schema, ensure_ascii=None)}")', ASCII),
        "x_tool_call_grammar__mutmut_20": ('rules.append(f"call_{i}: %json {json.dumps(schema, )}")', ASCII),
        "x_tool_call_grammar__mutmut_21": (
            'rules.append(f"call_{i}: %json {json.dumps(schema, ensure_ascii=True)}")', ASCII),
        "x_tool_call_processor__mutmut_18": (
            "matcher = llguidance.LLMatcher(tok, grammar, log_level=None)", LOG_LEVEL),
        "x_tool_call_processor__mutmut_21": ("matcher = llguidance.LLMatcher(tok, grammar, )", LOG_LEVEL),
        "x_tool_call_processor__mutmut_22": ("matcher = llguidance.LLMatcher(tok, grammar, log_level=1)", LOG_LEVEL),
        "xǁGrammarProcessorǁ__call____mutmut_16": (
            "allowed = self._mask(logits.shape[-1], None)", CPU_DEVICE),
        "xǁGrammarProcessorǁ_mask__mutmut_25": ("return allowed.to(None)", CPU_DEVICE),
        "xǁGrammarProcessorǁ__call____mutmut_32": (
            'return logits.masked_fill(~allowed, float("-INF"))', 'float() reads "-INF" as "-inf": the same value'),
        "xǁGrammarProcessorǁ__init____mutmut_3": (
            "self._seen = None", "completion_ids[None:] is completion_ids[0:]; the first call then sets a count"),
        "xǁGrammarProcessorǁ_mask__mutmut_24": (
            "allowed[: bits.shape[0]] = torch.from_numpy(bits.astype(None))",
            "0/1 floats written into the bool tensor convert as the 0/1 bools do"),
    },
}
