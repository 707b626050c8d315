"""P/D disaggregation: the shared secret that binds a prefill and a decode instance.

Two things cross between the instances, and both are proven with one secret both hold (issue 34,
items 1 and 2): ``torch.distributed`` (gloo, NCCL) authenticates nobody, and a client could write
``kv_transfer_params`` itself.

- **Pairing** (``link_proof``): once the two-rank group is up and before any token or KV crosses
  it, each side draws a 32-byte nonce, both nonces are exchanged over the group, and each side
  sends ``HMAC-SHA256(secret, "prefixgate-pd-link/v1|" + role + "|" + nonce0 + nonce1 +
  layout)``; each checks the other's (``hmac.compare_digest``). A process without the secret —
  one that joined as rank 1 before the decode instance, or hosted the rendezvous before the
  prefill instance — fails and is dropped; a recorded proof is useless against fresh nonces.
- **Tickets** (``ticket_tag``): the prefill answer's ``kv_transfer_params`` carry
  ``transfer_tag = HMAC-SHA256(secret, "prefixgate-pd-ticket/v1|" + transfer id + first token
  ids + SHA-256 of the prompt ids and cache_salt)``. The decode instance refuses params whose tag
  does not verify (a made-up or altered transfer id, chosen first tokens, a ticket replayed on
  another prompt) at once, without waiting for a transfer that will never come.

The secret comes from ``--pd-secret-file`` or the ``PREFIXGATE_PD_SECRET`` environment variable
(at least :data:`MIN_SECRET_BYTES` bytes; ``python -c "import secrets; print(secrets.token_hex(32))"``
makes one). A ``prefill`` or ``decode`` role without one refuses to start.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ENV_SECRET", "MIN_SECRET_BYTES", "NONCE_BYTES", "link_proof", "load_secret",
           "new_nonce", "ticket_tag", "verify_ticket"]

ENV_SECRET = "PREFIXGATE_PD_SECRET"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32
PROOF_BYTES = 32


def load_secret(path: str | None = None, environ: dict[str, str] | None = None) -> bytes:
    """The P/D secret: the contents of ``path`` (surrounding whitespace stripped) when given,
    else ``$PREFIXGATE_PD_SECRET``. Raises ``ValueError`` when there is none or it is shorter
    than :data:`MIN_SECRET_BYTES` bytes."""
    env = os.environ if environ is None else environ
    if path:
        raw = Path(path).read_bytes().strip()
        where = f"--pd-secret-file {path}"
    else:
        raw = env.get(ENV_SECRET, "").strip().encode()
        where = f"${ENV_SECRET}"
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"the P/D roles need a shared secret of at least {MIN_SECRET_BYTES} bytes "
                         f"(both instances the same) in {where}: the link between them is "
                         "authenticated with it")
    return raw


def new_nonce() -> bytes:
    """A fresh pairing nonce (:data:`NONCE_BYTES` random bytes)."""
    return secrets.token_bytes(NONCE_BYTES)


def link_proof(secret: bytes, role: str, nonces: Sequence[bytes], layout: Sequence[int]) -> bytes:
    """What ``role`` (``prefill`` or ``decode``) sends to prove it holds ``secret`` for this
    pairing: an HMAC-SHA256 (32 bytes) over the role, both ranks' nonces (rank 0 first) and the
    KV layout both announced."""
    msg = b"prefixgate-pd-link/v1|" + role.encode() + b"|" + b"".join(nonces)
    msg += struct.pack(f">{len(layout)}q", *layout)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _prompt_digest(prompt: Sequence[int], extra_key: bytes | None) -> bytes:
    h = hashlib.sha256()
    h.update(struct.pack(">q", len(prompt)))
    h.update(struct.pack(f">{len(prompt)}q", *prompt))
    h.update(extra_key or b"")
    return h.digest()


def ticket_tag(secret: bytes, transfer_id: int, first_token_ids: Sequence[int],
               prompt: Sequence[int], extra_key: bytes | None) -> str:
    """The ``transfer_tag`` of a prefill answer (module docstring): 64 hex digits."""
    msg = b"prefixgate-pd-ticket/v1|" + struct.pack(">Q", transfer_id)
    msg += struct.pack(f">{len(first_token_ids)}q", *first_token_ids)
    msg += _prompt_digest(prompt, extra_key)
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify_ticket(secret: bytes, tag: object, transfer_id: int, first_token_ids: Sequence[int],
                  prompt: Sequence[int], extra_key: bytes | None) -> bool:
    """Whether ``tag`` is the ``ticket_tag`` of these fields (constant-time compare)."""
    if not isinstance(tag, str) or len(tag) != 64:
        return False
    want = ticket_tag(secret, transfer_id, first_token_ids, prompt, extra_key)
    return hmac.compare_digest(want, tag)
