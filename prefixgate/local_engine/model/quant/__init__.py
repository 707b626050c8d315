"""Quantisation of the model's linears: int8 weight-only (``int8``), which layers stay full
precision (``sensitivity``), packed CPU linears (``cpu_linear``) and the screened LM head
(``screened_head``).
"""

__all__ = [
    "cpu_features", "cpu_linear", "int8", "screened_head", "sensitivity",
]
