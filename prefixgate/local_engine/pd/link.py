"""P/D disaggregation: the KV link between one prefill and one decode instance.

``torch.distributed`` point-to-point over a two-rank process group (rank 0 prefill, rank 1
decode): gloo on CPU, NCCL when the KV pool is on CUDA. The group, the header tensors and one
staging buffer per side (``buffer_tokens`` tokens of K+V, ``kv_io.kv_view`` layout) are set
up once when the link starts (measured here: registering memory per request cost 0.7 s against
an 80-90 ms transfer of 4k tokens); each transfer then is three sends on one thread per side:

    header int64[8]: [kind, transfer id, start, n kv tokens, n tokens, salt bytes, 0, 0]
    tokens int64[start + n]   (the decode side inserts them into its radix tree)
    salt   uint8[salt bytes]  (the cache_salt namespace; only when there is one)
    kv     [L, 2, n, H, D]    (the pool dtype)

Pairing: rank 0 hosts the rendezvous store (``TCPStore`` on ``init_method``'s port), rank 1
joins it (claiming the decode rank in the store: a second claimant is refused), both join the
group, exchange nonces and their KV layout (layers, KV heads, head dim, page size, dtype,
buffer tokens) and prove the pair's shared secret (``pd.auth.link_proof``) before any token
or KV crosses; a peer that fails the proof, or another layout, is refused. A failed send or
receive (peer gone, gloo timeout) marks the link ``dead``: the caller's ``on_dead`` frees what
waits on it, and ``reset`` tears the group and the store down so that ``start`` can pair again
(``pd.roles`` does, after every lost peer). An idle prefill side sends a heartbeat header
(``KIND_PING``) every third of the timeout, so only a peer that is really gone trips the decode
side's receive timeout — and a lost decode peer is found within that third.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from prefixgate.local_engine.pd.auth import MIN_SECRET_BYTES, link_proof, load_secret, new_nonce

__all__ = ["KIND_CLOSE", "KIND_KV", "KIND_PING", "KVLayout", "LinkDead", "PDLink", "Received"]

log = logging.getLogger("local_engine.pd")

KIND_KV = 1
KIND_CLOSE = 2
KIND_PING = 3  # an idle prefill side's heartbeat: the receive's timeout means a lost peer only
MAX_SALT_BYTES = 4096
MAX_PROMPT_TOKENS = 1 << 17  # token ids one transfer may carry (an int64 buffer of 1 MiB)
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


class LinkDead(RuntimeError):
    """The peer is gone or never paired: no transfer can go through this link. ``reason``: why
    a pairing was refused (``rendezvous``, ``auth``, ``second_rank``, ``layout``, ``error``), or
    ``down``."""

    def __init__(self, message: str, reason: str = "down") -> None:
        super().__init__(message)
        self.reason = reason


def _host_port(init_method: str) -> tuple[str, int]:
    """``(host, port)`` of ``tcp://HOST:PORT``. Raises ``ValueError`` otherwise."""
    u = urlsplit(init_method)
    if u.scheme != "tcp" or not u.hostname or not u.port:
        raise ValueError(f"the P/D link takes tcp://HOST:PORT, not {init_method!r}")
    return u.hostname, u.port


@dataclass(frozen=True)
class KVLayout:
    """What both sides must share to exchange KV: ``layers``, ``heads`` (KV heads),
    ``head_dim``, ``page_size``, ``dtype`` and ``buffer_tokens`` (the most tokens one transfer
    carries)."""

    layers: int
    heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    buffer_tokens: int

    def as_tensor(self, device: torch.device) -> torch.Tensor:
        """The layout as int64[6] (the pairing handshake)."""
        return torch.tensor([self.layers, self.heads, self.head_dim, self.page_size,
                             _DTYPE_CODES.get(self.dtype, 0), self.buffer_tokens],
                            dtype=torch.int64, device=device)

    @property
    def per_token(self) -> int:
        """Elements of K+V per token over all layers."""
        return self.layers * 2 * self.heads * self.head_dim


@dataclass(frozen=True)
class Received:
    """One transfer as the decode side's receiver got it (``kv`` is a view into the staging
    buffer: valid until the receiver's callback returns)."""

    transfer_id: int
    start: int
    tokens: list[int]
    extra_key: bytes | None
    kv: torch.Tensor


class PDLink:
    """One side of the link. ``role`` ``prefill`` (rank 0, sends) or ``decode`` (rank 1,
    receives); ``init_method`` e.g. ``tcp://127.0.0.1:29517`` (rank 0 hosts the store);
    ``timeout_s`` bounds pairing and each send / receive (gloo's timeout).

    ``start()`` pairs in the calling thread (blocks until the peer joins or ``timeout_s``).
    Raises ``LinkDead`` when pairing fails, the peer fails the proof, or the layouts differ;
    ``reset()`` then ``start()`` pairs again. ``secret``: the pair's (``pd.auth``; None: from
    the environment). ``pairings`` counts successful pairings, ``refused`` failures by reason.

    ``backend`` None: NCCL for a CUDA pool, gloo otherwise. ``gloo`` with a CUDA pool stages the
    KV through host memory (one more copy each way): the path for two instances on ONE GPU,
    since NCCL refuses two ranks on the same device.
    """

    def __init__(self, role: str, init_method: str, layout: KVLayout, device: torch.device,
                 timeout_s: float = 30.0, backend: str | None = None,
                 secret: bytes | None = None) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError(f"role must be prefill or decode, not {role!r}")
        _host_port(init_method)
        self.secret = secret if secret is not None else load_secret()
        if len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the P/D secret must be at least {MIN_SECRET_BYTES} bytes")
        self.pairings = 0
        self.refused: Counter[str] = Counter()
        self._store: Any = None
        self.role = role
        self.rank = 0 if role == "prefill" else 1
        self.init_method = init_method
        self.layout = layout
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, not {self.backend!r}")
        self.pool_device = device
        self.device = device if self.backend == "nccl" else torch.device("cpu")  # the comm side
        self.stage = torch.zeros(0, dtype=layout.dtype, device=device)  # pool-side staging
        self.timeout_s = timeout_s
        self.dead = False
        self.ready = threading.Event()
        self._send_lock = threading.Lock()
        self.header = torch.zeros(8, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(0, dtype=torch.int64, device=device)
        self.salt = torch.zeros(MAX_SALT_BYTES, dtype=torch.uint8, device=device)
        self.buffer = torch.zeros(0, dtype=layout.dtype, device=device)

    # -- pairing -----------------------------------------------------------------------------
    def start(self) -> None:
        """Pair: host (prefill) or join (decode) the rendezvous store, join the two-rank group,
        prove both sides hold the secret (``pd.auth.link_proof``), check the peer's layout and
        allocate the staging buffers once. Raises ``LinkDead`` (and leaves the link torn down,
        ready for another ``start``) when pairing fails, the peer fails the proof, a second
        rank claimed the decode side, or the layouts differ; ``refused`` counts the reasons."""
        self.dead = False
        self.ready.clear()
        try:
            self._join()
        except LinkDead as exc:
            self.reset()
            self.refused[exc.reason] += 1
            raise
        except Exception as exc:
            self.reset()
            self.refused["error"] += 1
            raise LinkDead(f"pairing failed: {type(exc).__name__}", "error") from exc
        self.pairings += 1
        self.ready.set()
        log.info("P/D link up: %s rank %d over %s, %d-token buffer (pairing %d)", self.role,
                 self.rank, self.backend, self.layout.buffer_tokens, self.pairings)

    def _allocate(self) -> None:
        """The staging buffers, once for the link's life (kept across re-pairings; allocated
        before pairing, so both sides are ready to move KV the moment the proof passes)."""
        lay = self.layout
        if self.tokens.numel() == 0:
            self.tokens = torch.zeros(MAX_PROMPT_TOKENS, dtype=torch.int64, device=self.device)
            self.buffer = torch.zeros(lay.buffer_tokens * lay.per_token, dtype=lay.dtype,
                                      device=self.device)
        if self.pool_device != self.device and self.role == "prefill" and not self.stage.numel():
            self.stage = torch.zeros(lay.buffer_tokens * lay.per_token, dtype=lay.dtype,
                                     device=self.pool_device)

    def _join(self) -> None:
        self._allocate()
        host, port = _host_port(self.init_method)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            self._store = dist.TCPStore(host, port, 2, self.rank == 0, timeout=timeout,
                                        wait_for_workers=False)
        except Exception as exc:
            raise LinkDead(f"rendezvous at {host}:{port} failed: {type(exc).__name__}",
                           "rendezvous") from exc
        if self.rank == 1 and self._store.add("prefixgate/pd/decode", 1) != 1:
            raise LinkDead("another decode instance holds this link", "second_rank")
        try:
            dist.init_process_group(self.backend, store=self._store, rank=self.rank,
                                    world_size=2, timeout=timeout)
        except Exception as exc:
            raise LinkDead(f"pairing failed: {type(exc).__name__}", "rendezvous") from exc
        lay = self.layout
        mine = lay.as_tensor(self.device)
        peers = [torch.zeros_like(mine) for _ in range(2)]
        nonce = torch.frombuffer(bytearray(new_nonce()), dtype=torch.uint8).to(self.device)
        nonces = [torch.zeros_like(nonce) for _ in range(2)]
        dist.all_gather(nonces, nonce)
        dist.all_gather(peers, mine)
        got = [bytes(n.cpu().tolist()) for n in nonces]
        announced = [int(x) for p in peers for x in p.tolist()]
        proof = torch.frombuffer(bytearray(link_proof(self.secret, self.role, got, announced)),
                                 dtype=torch.uint8).to(self.device)
        proofs = [torch.zeros_like(proof) for _ in range(2)]
        dist.all_gather(proofs, proof)
        other = "decode" if self.role == "prefill" else "prefill"
        want = link_proof(self.secret, other, got, announced)
        if not hmac.compare_digest(bytes(proofs[1 - self.rank].cpu().tolist()), want):
            raise LinkDead(f"the {other} peer failed authentication (no shared secret)", "auth")
        if self.rank == 0 and self._store.add("prefixgate/pd/decode", 0) != 1:
            raise LinkDead("a second rank tried to join as the decode instance", "second_rank")
        if not torch.equal(peers[0], peers[1]):
            raise LinkDead(f"KV layouts differ: prefill {peers[0].tolist()}, "
                           f"decode {peers[1].tolist()}", "layout")

    def reset(self) -> None:
        """Tear the group and the rendezvous store down (the peer is gone, refused, or never
        came), so that ``start`` can pair again — with a restarted peer. The link is dead until
        then. Call it from the thread that used the link, once no send or receive runs."""
        self.dead = True
        self.ready.clear()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a group whose peer vanished mid-call
                log.warning("P/D group teardown: %s", type(exc).__name__)
        # A failed init_process_group counted a group but left none to destroy, and the count
        # names the group's keys in the store ("/<count>//cpu//..."): the next attempt would
        # wait on keys the peer (a fresh process, or one that failed as often) never writes.
        # destroy_process_group resets it the same way.
        world = getattr(distributed_c10d, "_world", None)
        if world is not None and hasattr(world, "group_count"):
            world.group_count = 0
        self._store = None

    def close(self) -> None:
        """Tell the decode side to stop (prefill side) and mark the link down (the group ends with
        the process: destroying it under a blocked receive can hang)."""
        if self.ready.is_set() and not self.dead and self.role == "prefill":
            try:
                with self._send_lock:
                    self.header.zero_()
                    self.header[0] = KIND_CLOSE
                    dist.send(self.header, dst=1)
            except Exception:
                pass
        self.dead = True

    # -- prefill side --------------------------------------------------------------------------
    def ping(self) -> None:
        """Send a heartbeat (the decode side's receive would time out on an idle link).
        Raises ``LinkDead`` (and marks the link dead) when the peer does not take it."""
        if self.dead or not self.ready.is_set():
            raise LinkDead("no paired decode instance")
        with self._send_lock:
            self.header.zero_()
            self.header[0] = KIND_PING
            try:
                dist.send(self.header, dst=1)
            except Exception as exc:
                self.dead = True
                raise LinkDead(f"ping failed: {type(exc).__name__}") from exc

    def send(self, transfer_id: int, start: int, tokens: list[int], extra_key: bytes | None,
             fill: Callable[[torch.Tensor], None]) -> None:
        """Send one transfer; ``fill(view)`` writes the K/V of ``tokens[start:]`` into the
        staging view ``[L, 2, n, H, D]``. Raises ``LinkDead`` (and marks the link dead) when
        the peer does not take it; ``ValueError`` when it exceeds the buffer."""
        from prefixgate.local_engine.pd.kv_io import kv_view

        if self.dead or not self.ready.is_set():
            raise LinkDead("no paired decode instance")
        n = len(tokens) - start
        salt = extra_key or b""
        if n > self.layout.buffer_tokens or len(salt) > MAX_SALT_BYTES or (
                len(tokens) > MAX_PROMPT_TOKENS):
            raise ValueError(f"transfer of {n} tokens exceeds the {self.layout.buffer_tokens}-token "
                             "buffer (or its prompt or cache_salt is too long)")
        lay = self.layout
        with self._send_lock:
            view = kv_view(self.buffer, lay.layers, n, lay.heads, lay.head_dim)
            if self.stage.numel():  # the pool is on another device: gather there, then copy
                staged = kv_view(self.stage, lay.layers, n, lay.heads, lay.head_dim)
                fill(staged)
                view.copy_(staged)
            else:
                fill(view)
            self.header.copy_(torch.tensor([KIND_KV, transfer_id, start, n, len(tokens), len(salt),
                                            0, 0], dtype=torch.int64))
            self.tokens[: len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            if salt:
                self.salt[: len(salt)] = torch.frombuffer(bytearray(salt), dtype=torch.uint8)
            try:
                dist.send(self.header, dst=1)
                dist.send(self.tokens[: len(tokens)], dst=1)
                if salt:
                    dist.send(self.salt[: len(salt)], dst=1)
                dist.send(view.reshape(-1), dst=1)
            except Exception as exc:
                self.dead = True
                raise LinkDead(f"send failed: {type(exc).__name__}") from exc

    # -- decode side ---------------------------------------------------------------------------
    def receive_forever(self, on_transfer: Callable[[Received], None],
                        on_dead: Callable[[], None]) -> None:
        """Receive transfers until the prefill side closes or goes away; ``on_transfer`` runs
        for each (it must be done with ``received.kv`` when it returns); ``on_dead`` runs once
        at the end, whatever the reason."""
        from prefixgate.local_engine.pd.kv_io import kv_view

        lay = self.layout
        try:
            while True:
                dist.recv(self.header, src=0)
                kind, tid, start, n, ntok, nsalt = (int(x) for x in self.header[:6].tolist())
                if kind == KIND_PING:
                    continue
                if kind != KIND_KV:
                    log.info("P/D link closed by the prefill side")
                    return
                dist.recv(self.tokens[:ntok], src=0)
                salt = None
                if nsalt:
                    dist.recv(self.salt[:nsalt], src=0)
                    salt = bytes(self.salt[:nsalt].cpu().tolist())
                view = kv_view(self.buffer, lay.layers, n, lay.heads, lay.head_dim)
                dist.recv(view.reshape(-1), src=0)
                tokens = self.tokens[:ntok].tolist()
                try:
                    on_transfer(Received(tid, start, tokens, salt, view))
                except Exception:
                    log.exception("P/D import of transfer %d failed", tid)
        except Exception as exc:
            log.warning("P/D link lost: %s", type(exc).__name__)
        finally:
            self.dead = True
            on_dead()
