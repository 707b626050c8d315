"""Shared pieces of the KV event tests: loopback ZMQ endpoints, a recorder over a real radix
tree with a real publisher, and a wait on a condition."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from prefixgate.config.routing import KVEventsSettings
from prefixgate.local_engine.kv.events import KVEventRecorder
from prefixgate.local_engine.kv.publisher import KVEventPublisher
from prefixgate.local_engine.kv.radix_cache import RadixCache


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoints() -> tuple[str, str]:
    """(PUB endpoint, replay endpoint) on two free loopback ports."""
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


class Published:
    """A radix tree whose changes a real :class:`KVEventPublisher` publishes."""

    def __init__(self, block_size: int = 4, buffer_steps: int = 1000, algo: str = "sha256",
                 seed: str = "") -> None:
        self.pub_at, self.replay_at = endpoints()
        self.tree = RadixCache()
        self.rec = KVEventRecorder(block_size, algo, seed)
        self.tree.on_evict, self.tree.on_reset = self.rec.evicted, self.rec.cleared
        self.pub = KVEventPublisher(self.rec, self.pub_at, self.replay_at,
                                    buffer_steps=buffer_steps, flush_ms=5)
        self.pub.start()
        self._slot = 0

    def settings(self, **kw: object) -> KVEventsSettings:
        """The router's settings for this publisher."""
        return KVEventsSettings(endpoint=self.pub_at, replay=self.replay_at,
                                block_size=self.rec.block_size, hash=self.rec.algo,  # type: ignore[arg-type]
                                seed=self.rec.seed, **kw)  # type: ignore[arg-type]

    def insert(self, tokens: list[int], salt: bytes | None = None) -> None:
        """Insert ``tokens`` into the tree as the KV manager does (and tell the recorder)."""
        slots = list(range(self._slot, self._slot + len(tokens)))
        self._slot += len(tokens)
        self.tree.insert(tokens, slots, salt)
        self.rec.stored(salt, tokens)

    def close(self) -> None:
        """Stop the publisher."""
        self.pub.close()


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``cond()`` holds; AssertionError after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
