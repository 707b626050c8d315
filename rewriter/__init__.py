"""Pure prompt rewriting: the prompt IR (OpenAI Chat + Anthropic Messages) and its passes.

Public entry point: :func:`rewrite_request` (see ``rewriter/pipeline.py``).
"""
