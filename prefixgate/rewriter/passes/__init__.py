"""The rewrite passes, one file each: ``run(prompt, ctx) -> (prompt, edits)``. A new pass is one
file here plus its place in ``prefixgate.rewriter.pipeline``.
"""

__all__ = [
    "breakpoints", "canonicalize_tools", "dedupe", "hoist_volatile", "prune_history", "prune_rag",
    "prune_tools", "stabilise_passages",
]
