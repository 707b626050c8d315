"""Prefill/decode disaggregation (engine layer 4): the roles, the KV link between the two engines
and the KV export / import it carries.
"""

__all__ = ["kv_io", "link", "roles"]
