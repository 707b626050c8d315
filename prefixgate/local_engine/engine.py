"""The engine: a background step loop and the facade the HTTP server and benchmarks use.

One daemon thread owns the model, the KV pool, the radix tree and the scheduler. Callers talk to
it through a queue of typed commands (``AddCmd`` / ``AbortCmd`` / ``StopCmd``); results come back
through a per-request sink called on the engine thread (``generate`` forwards them into its
asyncio loop). Each step: schedule (with drafts when speculative decoding is on) → forward →
sample / verify drafts → stop checks → release finished requests → emit outputs.

    engine = Engine(EngineConfig(model_path="~/.cache/prefixgate/models/SmolLM2-135M-Instruct"))
    async for out in engine.generate(ids, SamplingParams(max_tokens=32, temperature=0)):
        print(out.text_delta, end="")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import RadixCache
from prefixgate.local_engine.kv.span_match import SpanBounds
from prefixgate.local_engine.model.files import dtype_named, eos_ids, load_tokenizer
from prefixgate.local_engine.model.llama import load_model, rope_inv_freq, split_model_path
from prefixgate.local_engine.model.quant import cpu_linear
from prefixgate.local_engine.model.quant.int8 import quantize_model
from prefixgate.local_engine.model.quant.sensitivity import kept_layers
from prefixgate.local_engine.sched.api_types import EngineConfig, PromptTooLong, RequestOutput, SamplingParams
from prefixgate.local_engine.sched.detokenizer import IncrementalDetokenizer
from prefixgate.local_engine.sched.engine_commands import (
    AbortCmd,
    AddCmd,
    CallCmd,
    Command,
    ResetCacheCmd,
    StopCmd,
)
from prefixgate.local_engine.sched.model_runner import ModelRunner
from prefixgate.local_engine.sched.sampler import (
    SamplingError,
    make_generator,
    needs_preparing,
    prepare_row,
    sample_rows,
)
from prefixgate.local_engine.sched.scheduler import ScheduledSeq, Scheduler
from prefixgate.local_engine.sched.sequence import Sequence, Status
from prefixgate.local_engine.sched.span_reuse import SpanReuse, value_tokens_of
from prefixgate.local_engine.spec.factory import build_spec_decoder

__all__ = ["Engine", "EngineConfig", "PromptTooLong", "RequestOutput", "SamplingParams"]

log = logging.getLogger("local_engine")

DEFAULT_KV_GB = {"cpu": 1.0, "cuda": 16.0}

Sink = Callable[[RequestOutput | BaseException], None]




class Engine:
    """Continuous-batching engine with radix-tree prefix KV reuse (see module docstring).

    Attributes: ``tokenizer`` (HF tokenizer of the model), ``model_name``, ``max_context_len``
    (prompt + completion tokens one request may hold), ``vocab_size`` (the logits' width),
    ``cfg``.
    Raises ``OSError`` / ``ValueError`` from loading when the model is missing or unsupported.
    """

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        dev_kind = self.device.type
        self.dtype = dtype_named(cfg.dtype, torch.float32 if dev_kind == "cpu" else torch.bfloat16)
        kv_dtype = dtype_named(cfg.kv_dtype, self.dtype)
        path = str(Path(cfg.model_path).expanduser())
        self.tokenizer = load_tokenizer(path)
        self.model = load_model(path, self.device, self.dtype)
        if cfg.quantization is not None:
            a = self.model.args
            keep = kept_layers(a.num_layers, a.hidden_size, cfg.quant_fp32_layers)
            quantize_model(self.model, cfg.quantization, keep, cfg.quant_fp32_head,
                           cfg.quant_outlier_channels)
        elif cfg.packed_linear and cpu_linear.available(self.device, self.dtype):
            cpu_linear.pack_model(self.model)
        args = self.model.args
        self.vocab_size = args.vocab_size  # logits width: token ids and logit_bias keys below it
        self.model_name = cfg.model_name or Path(split_model_path(path)[1] or path).name.removesuffix(".gguf")
        ctx = min(cfg.max_context_len or args.max_position_embeddings, args.max_position_embeddings)
        if cfg.num_kv_slots is not None:
            slots = cfg.num_kv_slots
        else:
            gb = cfg.kv_memory_gb or DEFAULT_KV_GB.get(dev_kind, 1.0)
            slots = KVPool.slots_for_budget(gb, args.num_layers, args.num_kv_heads, args.head_dim, kv_dtype)
            if cfg.kv_memory_gb is None:
                slots = min(slots, cfg.max_running * ctx)
        self.pool = KVPool(args.num_layers, slots, args.num_kv_heads, args.head_dim, kv_dtype,
                           self.device, cfg.page_size)
        self.max_context_len = min(ctx, self.pool.num_slots)
        self.table = ReqToTokenTable(cfg.max_running, self.max_context_len, self.device)
        self.cache = RadixCache(cfg.page_size) if cfg.enable_prefix_cache else None
        span = None
        if cfg.span_reuse and self.cache is not None:
            values = functools.partial(value_tokens_of, self.tokenizer)
            span = SpanReuse(SpanBounds(cfg.span_reuse_max_spans, cfg.span_reuse_max_span_tokens,
                                        cfg.span_reuse_min_anchor_tokens), rope_inv_freq(args),
                             changeable=values if cfg.span_reuse_values_only else None)
        self.scheduler = Scheduler(self.pool, self.table, self.cache, cfg.max_num_batched_tokens,
                                   cfg.chunk_size, cfg.max_running, span)
        self.runner = ModelRunner(self.model, self.pool, self.table, self.max_context_len,
                                  self.device, self.dtype)
        self.eos_ids = eos_ids(path, self.tokenizer)
        self.kv_events = self._kv_events(cfg)
        self.spec = build_spec_decoder(cfg, self.scheduler.kv, self.device, self.dtype,
                                       args.vocab_size, self.max_context_len, self.tokenizer)
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._paced: deque[CallCmd] = deque()  # paced calls waiting for their step (CallCmd)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._seqs: dict[str, Sequence] = {}
        self._timing = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0}
        self.steps_run = 0  # forward steps so far
        self._stopped = False

    def _kv_events(self, cfg: EngineConfig) -> Any:
        """The KV event publisher when ``cfg.kv_events_endpoint`` is set (None: off)."""
        if cfg.kv_events_endpoint is None or self.cache is None:
            return None
        from prefixgate.local_engine.kv.events import KVEventRecorder
        from prefixgate.local_engine.kv.publisher import KVEventPublisher

        rec = KVEventRecorder(cfg.kv_events_block_size, cfg.kv_events_hash, cfg.kv_events_seed,
                              cfg.page_size)
        self.scheduler.kv.on_insert.append(rec.on_insert)
        self.cache.on_evict, self.cache.on_reset = rec.evicted, rec.cleared
        pub = KVEventPublisher(rec, cfg.kv_events_endpoint, cfg.kv_events_replay)
        pub.start()
        return pub

    def reset_prefix_cache(self, timeout_s: float = 30.0) -> bool:
        """Empty the prefix cache (``AllBlocksCleared`` to KV event consumers) when no request
        holds part of it; True when it was emptied. Any thread; waits for the engine thread."""
        got: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._ensure_thread()
        self._inbox.put(ResetCacheCmd(got.put))
        return got.get(timeout=timeout_s)

    # -- request construction (caller's thread) ------------------------------------------------
    def _make_seq(self, prompt_ids: list[int], params: SamplingParams, extra_key: bytes | None,
                  request_id: str | None, sink: Sink) -> Sequence:
        params.validate(self.vocab_size)
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self.max_context_len:
            raise PromptTooLong(
                f"prompt of {len(prompt_ids)} tokens leaves no room for a completion within the "
                f"context of {self.max_context_len} tokens")
        vocab = self.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"token id out of range [0, {vocab})")
        max_tokens = min(params.max_tokens, self.max_context_len - len(prompt_ids))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        return Sequence(
            request_id=request_id or uuid.uuid4().hex,
            prompt_ids=list(prompt_ids),
            params=params,
            max_tokens=max_tokens,
            extra_key=extra_key,
            generator=make_generator(params.seed, self.device),  # same device as the logits
            detok=IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop),
            stop_ids=stop_ids,
            sink=sink,
        )

    def _submit(self, seq: Sequence, given: tuple[int, ...] = ()) -> None:
        if self._stopped:
            raise RuntimeError("engine is shut down")
        self._ensure_thread()
        self._inbox.put(AddCmd(seq, given))

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
                self._thread.start()

    # -- facade --------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       extra_key: bytes | None = None,
                       request_id: str | None = None,
                       given_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request: one ``RequestOutput`` per decode step, the last has ``finished``.

        ``given_ids``: first completion tokens sampled elsewhere (P/D: the prefill side's), emitted
        at once and counted toward ``max_tokens`` and the stop checks.

        Raises ``PromptTooLong`` / ``ValueError`` before streaming for bad input. Closing or
        cancelling the iterator aborts the request and frees its slots.
        """
        loop = asyncio.get_running_loop()
        outq: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def sink(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(outq.put_nowait, item)

        seq = self._make_seq(prompt_ids, params, extra_key, request_id, sink)
        given = tuple(given_ids or ())
        if given and (min(given) < 0 or max(given) >= self.vocab_size):
            raise ValueError(f"given token id out of range [0, {self.vocab_size})")
        self._submit(seq, given)
        done = False
        try:
            while True:
                item = await outq.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                yield item
                if done:
                    return
        finally:
            if not done:
                self.abort(seq.request_id)

    def generate_batch(self, prompts: list[list[int]],
                       params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Run ``prompts`` to completion (blocking); returns each one's completion token ids."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or a single one")
        results: list[list[int]] = [[] for _ in prompts]
        errors: list[BaseException] = []
        remaining = [len(prompts)]
        cond = threading.Condition()

        def make_sink(i: int) -> Sink:
            def sink(item: RequestOutput | BaseException) -> None:
                with cond:
                    if isinstance(item, BaseException):
                        errors.append(item)
                        remaining[0] -= 1
                    else:
                        results[i].extend(item.new_token_ids)
                        if item.finished:
                            remaining[0] -= 1
                    cond.notify_all()
            return sink

        seqs = [self._make_seq(p, sp, None, None, make_sink(i))
                for i, (p, sp) in enumerate(zip(prompts, plist))]
        for s in seqs:
            self._submit(s)
        with cond:
            while remaining[0] > 0:
                cond.wait(timeout=1.0)
        if errors:
            raise errors[0]
        return results

    def abort(self, request_id: str) -> None:
        """Stop a request (waiting or running) and free its slots; unknown ids are ignored."""
        self._inbox.put(AbortCmd(request_id))

    def call(self, fn: Callable[[], Any], paced: bool = False) -> concurrent.futures.Future[Any]:
        """Run ``fn()`` on the engine thread before its next step (``CallCmd``; ``paced``: after
        the next step while requests run, one paced call per step); the returned future holds
        its result. Raises ``RuntimeError`` once the engine is shut down."""
        if self._stopped:
            raise RuntimeError("engine is shut down")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._ensure_thread()
        self._inbox.put(CallCmd(fn, fut, paced))
        return fut

    def stats(self) -> dict[str, float | int]:
        """Counters: KV slots used/total, cache hit (of which reused across a changed span)
        and prompt tokens (totals), queue sizes,
        prefill / decode throughput (tokens/s over steps that did prefill / only decode),
        retractions and evicted slots (totals)."""
        st = self.scheduler.stats
        t = self._timing
        spec = self.spec.stats() if self.spec is not None else {}
        return spec | {
            "kv_slots_used": self.pool.used_slots,
            "kv_slots_total": self.pool.num_slots,
            "kv_slots_cached": self.cache.total_size if self.cache else 0,
            "cache_hit_tokens_total": st.cache_hit_tokens,
            "span_reused_tokens_total": st.span_reused_tokens,
            "prompt_tokens_total": st.prompt_tokens,
            "prefill_tokens_total": st.prefill_tokens,
            "decode_tokens_total": st.decode_tokens,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "retractions_total": st.retractions,
            "evicted_slots_total": st.evicted_slots,
            "prefill_tokens_per_s": t["prefill_tokens"] / t["prefill_s"] if t["prefill_s"] else 0.0,
            "decode_tokens_per_s": t["decode_tokens"] / t["decode_s"] if t["decode_s"] else 0.0,
        }

    def shutdown(self) -> None:
        """Stop the step loop (running requests get an abort output) and join the thread."""
        self._stopped = True
        if self._thread is not None:
            self._inbox.put(StopCmd())
            self._thread.join(timeout=30)
            self._thread = None
        if self.kv_events is not None:
            self.kv_events.close()

    # -- the loop (engine thread) --------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                try:
                    cmd = self._inbox.get(block=not (self.scheduler.has_work() or self._paced))
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    if not self._handle(cmd):
                        self._abort_all()
                        return
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self.scheduler.has_work():
                    try:
                        self.step()  # isolates each request's failures (step docstring)
                    except Exception as exc:
                        log.exception("engine step failed outside any one request")
                        self._fail_all(exc)
                    if self._paced:
                        self._run(self._paced.popleft())
                while self._paced and not self.scheduler.has_work():  # nothing to pace against
                    self._run(self._paced.popleft())

    def _handle(self, cmd: Command) -> bool:
        if isinstance(cmd, StopCmd):
            return False
        if isinstance(cmd, AddCmd):
            self._seqs[cmd.seq.request_id] = cmd.seq
            if not (cmd.given and self._take_given(cmd.seq, cmd.given)):
                self.scheduler.add(cmd.seq)
        elif isinstance(cmd, ResetCacheCmd):
            freed = self.cache.reset() if self.cache is not None else None
            if freed is not None:
                self.pool.free(freed)
            cmd.done(freed is not None)
        elif isinstance(cmd, CallCmd):
            if cmd.paced and (self.scheduler.has_work() or self._paced):
                self._paced.append(cmd)
            else:
                self._run(cmd)
        else:
            seq = self.scheduler.abort(cmd.request_id)
            if seq is not None:
                self._emit(seq, final=True)
        return True

    @staticmethod
    def _run(cmd: CallCmd) -> None:
        """Run a call; its result or exception goes to its future."""
        if cmd.future.set_running_or_notify_cancel():
            try:
                cmd.future.set_result(cmd.fn())
            except Exception as exc:
                cmd.future.set_exception(exc)

    def _abort_all(self) -> None:
        while self._paced:  # paced calls still waiting for a step: cancelled likewise
            _cancel(self._paced.popleft().future)
        while True:  # calls queued behind the stop: their callers must not wait forever
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, CallCmd):
                _cancel(cmd.future)
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.abort(seq.request_id)
            self._emit(seq, final=True)

    def _fail_all(self, exc: BaseException) -> None:
        """Scheduling itself raised (no one request's part): the step's state is unknown, so
        every request fails with ``exc``."""
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._fail(seq, exc)

    def _fail(self, seq: Sequence, exc: BaseException, tell: bool = True) -> None:
        """Fail one request and carry on with the rest: its K/V beyond the radix-tree region is
        freed, not cached (a broken step's K/V must not reach other requests through the tree),
        it leaves the scheduler and the drafter, and (``tell``) its sink gets ``exc``."""
        log.warning("request %s failed: %s", seq.request_id, type(exc).__name__, exc_info=exc)
        if seq.status is Status.RUNNING and seq.row is not None:
            self.scheduler.kv.rollback(seq, seq.num_tree_tokens)
        self.scheduler.abort(seq.request_id)
        seq.status = Status.FINISHED
        self._seqs.pop(seq.request_id, None)
        if self.spec is not None:
            self.spec.release(seq)
        if tell:
            self._deliver(seq, exc)

    def _deliver(self, seq: Sequence, item: RequestOutput | BaseException) -> bool:
        """Hand ``item`` to the request's sink; a sink that raises (its event loop closed, a
        caller's bug) is logged and the request is dropped — no other request is touched.
        Returns whether the sink took it."""
        try:
            seq.sink(item)
            return True
        except Exception as exc:
            log.warning("sink of request %s raised %s; dropping the request", seq.request_id,
                        type(exc).__name__, exc_info=exc)
            if seq.request_id in self._seqs:
                self._fail(seq, exc, tell=False)
            return False

    def _emit(self, seq: Sequence, final: bool = False) -> None:
        text = seq.detok.take(final=final)
        if seq.status is Status.FINISHED:
            self._seqs.pop(seq.request_id, None)
            if self.spec is not None:
                self.spec.release(seq)
        self._deliver(seq, seq.output(text))

    def step(self) -> None:
        """One scheduling + forward + sampling / verification step (engine thread only).

        A failure inside one request's part of the step (its forward rows, logits processors,
        sampling, draft verification, its sink) fails that request alone (``_fail``); the rest
        of the batch continues with the tokens it would have had without it.
        """
        batch = self.scheduler.schedule(self.spec.propose if self.spec is not None else None)
        if not batch:
            return
        t0 = time.perf_counter()
        for it in batch:  # the end of each new request's queueing (RequestOutput.scheduled_at)
            if it.seq.scheduled_at is None:
                it.seq.scheduled_at = t0
        rows, failed = self._forward(batch)
        new_tokens = self._choose(rows, batch, failed)
        self.steps_run += 1
        dt = time.perf_counter() - t0
        n_rows = sum(it.num_rows for it in batch)
        kind = "decode" if all(it.is_decode for it in batch) else "prefill"
        self._timing[f"{kind}_s"] += dt
        self._timing[f"{kind}_tokens"] += n_rows if kind == "prefill" else sum(
            len(t) for t in new_tokens.values())
        self.scheduler.complete_step([it for it in batch if id(it) not in failed])
        for it in batch:
            if id(it) in failed:
                self._fail(it.seq, failed[id(it)])
                continue
            toks = new_tokens.get(id(it))
            if toks is None:  # a prefill chunk that does not end the prompt: nothing to sample
                continue
            try:
                if it.draft is not None:
                    self.scheduler.accept_draft(it.seq, toks[:-1])
                self._append(it.seq, toks)
            except Exception as exc:  # stop checks / detokenizing this request's tokens
                self._fail(it.seq, exc)

    def _forward(self, batch: list[ScheduledSeq]
                 ) -> tuple[dict[int, torch.Tensor], dict[int, BaseException]]:
        """Logits rows per item (``id(item)`` → ``[rows, V]``; items that end their prompt or
        decode) and the items that failed. When the batched forward raises, each item runs
        alone (its K/V writes are the same tokens at the same slots, so re-running is exact),
        and only the items that fail alone are failed."""
        try:
            return _rows_by_item(*self.runner.run(batch)), {}
        except Exception as exc:
            if len(batch) == 1:
                return {}, {id(batch[0]): exc}
            log.warning("forward of a %d-request step failed (%s); running each alone",
                        len(batch), type(exc).__name__)
        rows: dict[int, torch.Tensor] = {}
        failed: dict[int, BaseException] = {}
        for it in batch:
            try:
                rows.update(_rows_by_item(*self.runner.run([it])))
            except Exception as exc:
                failed[id(it)] = exc
        return rows, failed

    def _choose(self, rows: dict[int, torch.Tensor], items: list[ScheduledSeq],
                failed: dict[int, BaseException]) -> dict[int, list[int]]:
        """Tokens each item's request gains this step (``id(item)`` → ids): one sampled token,
        or the accepted draft tokens + one (speculative items, ``spec.decode.verify``). An item
        whose processors, sampling or verification raise goes into ``failed`` instead."""
        out: dict[int, list[int]] = {}
        plain = [it for it in items if id(it) in rows and it.draft is None and id(it) not in failed]
        if plain:
            picked = torch.cat([rows[id(it)] for it in plain])  # [P, V]
            if any(needs_preparing(it.seq.params) for it in plain):
                picked = picked.clone()
            for j, it in enumerate(plain):
                s = it.seq
                if needs_preparing(s.params):  # constrained decoding (tool_mask), biases, penalties
                    try:
                        picked[j] = prepare_row(picked[j], s.params, s.token_ids, s.num_prompt)
                    except Exception as exc:
                        failed[id(it)] = exc
            toks = sample_rows(picked, [it.seq.params for it in plain],
                               [it.seq.generator for it in plain])
            for it, tok in zip(plain, toks):
                if id(it) in failed:
                    continue
                if isinstance(tok, SamplingError):
                    failed[id(it)] = tok
                else:
                    out[id(it)] = [tok]
        for it in items:
            if it.draft is None or id(it) not in rows or id(it) in failed:
                continue
            assert self.spec is not None
            try:
                accepted, nxt = self.spec.verify(it.seq, rows[id(it)], it.draft)
            except Exception as exc:
                failed[id(it)] = exc
                continue
            out[id(it)] = accepted + [nxt]
        return out

    def _push(self, seq: Sequence, tokens: list[int] | tuple[int, ...]) -> bool:
        """Append ``tokens`` with stop checks (a stop drops the rest); True when it finished."""
        for tok in tokens:
            seq.token_ids.append(tok)
            seq.pending_ids.append(tok)
            if tok in seq.stop_ids or seq.detok.add(tok):
                seq.finish_reason = "stop"
            elif seq.num_completion >= seq.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                return True
        return False

    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        """``_push`` ``tokens``, release ``seq`` if it finished, then emit."""
        if self._push(seq, tokens):
            self.scheduler.finish(seq)
        self._emit(seq, final=seq.finish_reason is not None)

    def _take_given(self, seq: Sequence, given: tuple[int, ...]) -> bool:
        """Emit a new request's ``given`` tokens before any forward (their K/V comes with its
        next step); ``cached_tokens`` is its prompt's hit now (P/D: the import, locked by the
        server until the request ends). True when it finished on them (never queued)."""
        finished = self._push(seq, given)
        if self.cache is not None:
            seq.cached_tokens = self.cache.peek_prefix_len(seq.token_ids[: seq.num_prompt],
                                                           seq.extra_key)
            self.scheduler.stats.cache_hit_tokens += seq.cached_tokens
        if finished:
            seq.status = Status.FINISHED
            self.scheduler.stats.prompt_tokens += seq.num_prompt
        self._emit(seq, final=finished)
        return finished


def _cancel(fut: concurrent.futures.Future[Any]) -> None:
    """Cancel a call's future not yet run and wake its waiters (``concurrent.futures.wait``)."""
    with contextlib.suppress(RuntimeError):  # already cancelled and notified
        if fut.cancel():
            fut.set_running_or_notify_cancel()


def _rows_by_item(logits: torch.Tensor, items: list[ScheduledSeq]) -> dict[int, torch.Tensor]:
    """Split ``ModelRunner.run``'s ``logits [R, V]`` by item (packing order): ``num_rows`` rows
    for a decode carrying a draft, one row otherwise."""
    out: dict[int, torch.Tensor] = {}
    r = 0
    for it in items:
        n = it.num_rows if it.draft is not None else 1
        out[id(it)] = logits[r:r + n]
        r += n
    return out


def clone_params(params: SamplingParams, **changes: Any) -> SamplingParams:
    """A copy of ``params`` with ``changes`` applied (convenience for callers and tests)."""
    return replace(params, **changes)
