"""The prompt IR and its wire readers: ``ir`` (Prompt, Message, Block, Tool), ``codec`` (parse /
render by API), the OpenAI and Anthropic readers, and the API rules (``validate``).
"""

__all__ = ["anthropic", "codec", "common", "ir", "openai", "validate"]
