"""Pure prompt rewriting: the prompt IR (OpenAI Chat + Anthropic Messages) and its passes.

Public entry point: :func:`prefixgate.rewriter.pipeline.rewrite_request` ``(body, api, ctx) ->
RewriteResult``. No I/O, no HTTP; imports only ``config``, the stdlib and pydantic.

Map:

* ``ir.py`` — the lossless IR (``Prompt``, ``Message``, ``Block``, ``Tool``) and uniform
  queries (tool ids, used tool names, ``tool_choice``); ``wire_openai.py`` /
  ``wire_anthropic.py`` / ``wire.py`` — parse and render, key order kept.
* ``pipeline.py`` — pass order, per-pass validation and fail-open; ``validate.py`` — API rules.
* Passes (``run(prompt, ctx) -> (prompt, edits)``): ``canonicalize_tools.py``,
  ``hoist_volatile.py`` (detectors in ``volatile_spans.py``), ``prune_tools.py``,
  ``prune_rag.py``, ``prune_history.py``, ``breakpoints.py``.
* ``stable.py`` — the stable region (tools + system) and its hash; ``types.py`` — ``Edit``,
  ``Context``, ``RewriteResult``; ``tokens.py`` — offline token counting.
"""
