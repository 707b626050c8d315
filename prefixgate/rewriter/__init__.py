"""Pure prompt rewriting: the prompt IR (OpenAI Chat + Anthropic Messages) and its passes.

Public entry point: :func:`prefixgate.rewriter.pipeline.rewrite_request` ``(body, api, ctx) ->
RewriteResult``. No I/O, no HTTP; imports only ``config``, the stdlib and pydantic.

Map (layers, lower never importing higher: pipeline -> passes -> analysis -> wire):

* ``pipeline.py`` — pass order, per-pass validation and fail-open; ``types.py`` — ``Edit``,
  ``Context``, ``RewriteResult``; ``region_memo.py`` / ``token_memo.py`` — work kept across a
  session's requests.
* ``passes/`` — one file per pass (``run(prompt, ctx) -> (prompt, edits)``):
  ``canonicalize_tools``, ``hoist_volatile``, ``stabilise_passages``, ``prune_tools``,
  ``prune_rag`` (+ ``dedupe``), ``prune_history``, ``breakpoints``.
* ``analysis/`` — what the passes share: volatile-span detectors, learned volatility, passages,
  tool ranking, BM25, token counting, the stable region, TTL choice, whether a pass pays.
* ``wire/`` — the lossless IR (``ir.py``: ``Prompt``, ``Message``, ``Block``, ``Tool``), its
  readers and writers (``openai.py`` / ``anthropic.py``, dispatched by ``codec.py``, key order
  kept) and the API rules (``validate.py``).

``README.md`` beside this file: where each thing is, where a new pass goes.
"""
