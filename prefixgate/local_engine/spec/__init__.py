"""Speculative decoding (engine layer 3): drafters (n-gram, suffix index, tool-call grammar, a draft
model), verification of draft tokens, the factory that builds a decoder from the config, and
acceptance metrics.
"""

__all__ = ["decode", "draft_model", "drafters", "factory", "metrics", "suffix_index", "tool_drafter"]
