"""Prefill/decode disaggregation (engine layer 4): the roles, the KV link between the two engines
(authenticated with the pair's shared secret, ``auth``) and the KV export / import it carries.
"""

__all__ = ["auth", "kv_io", "link", "roles"]
