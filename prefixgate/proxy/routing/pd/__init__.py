"""Prefill/decode disaggregation, the proxy's side: whether a request splits (``split``: the
decision and the prefill request's body), driving a split through a P/D pair (``drive``) and
``prefixgate plan``'s model of colocating or splitting a route (``plan``).
"""

__all__ = ["drive", "plan", "split"]
