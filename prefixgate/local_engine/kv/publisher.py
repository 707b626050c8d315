"""Publish the recorder's KV events over ZMQ, as vLLM's ``ZmqEventPublisher`` does.

Wire (vllm/distributed/kv_events.py; a vLLM subscriber reads ours unchanged):

- **PUB** on ``endpoint`` (vLLM's default ``tcp://*:5557``): multipart
  ``[topic, seq (8 bytes, big-endian), payload]``; ``payload`` = msgpack of an ``EventBatch``
  ``[ts, [event, ...]]`` (``ts``: seconds since the epoch, float, when the batch was sent);
  ``seq`` counts batches from 1, +1 each, so a gap is a missing number.
- **ROUTER** on ``replay`` (a consumer's DEALER, with REQ's empty delimiter frame): request
  ``start_seq`` (8 bytes, big-endian); answer one frame ``[seq, payload]`` per buffered batch
  with ``seq >= start_seq``, then ``[-1 as 8 signed bytes, b""]``. Ours adds a **full
  resync**: when ``start_seq`` is 0, older than the oldest batch kept (``buffer_steps`` of
  them) or beyond the next one (the consumer saw an earlier run of this publisher: the engine
  restarted), the answer starts with a snapshot batch numbered with the latest ``seq`` —
  ``AllBlocksCleared`` plus every held block — and nothing older follows it.

One daemon thread owns both sockets (ZMQ sockets are not thread safe); every ``flush_ms`` it
sends what the engine thread recorded. Errors: ``zmq.ZMQError`` from :meth:`start` when an
endpoint cannot be bound.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from prefixgate.local_engine.kv.events import KVEventRecorder

log = logging.getLogger("local_engine.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventPublisher:
    """PUB + replay sockets over one :class:`KVEventRecorder` (module docstring).

    ``endpoint`` / ``replay``: ZMQ endpoints to bind (``replay`` None: no replay socket);
    ``topic``: the first frame; ``buffer_steps``: batches kept for replay; ``flush_ms``:
    the longest an event waits before it is sent.
    """

    def __init__(self, recorder: KVEventRecorder, endpoint: str, replay: str | None = None,
                 topic: str = "", buffer_steps: int = 10_000, flush_ms: float = 10.0) -> None:
        self.recorder, self.endpoint, self.replay = recorder, endpoint, replay
        self.topic = topic.encode()
        self.buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self.flush_s = flush_ms / 1e3
        self.seq = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind the sockets and start the thread; raises the bind error, if any."""
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Send what is pending, close the sockets, join the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _pack(self, events: list[list[object]]) -> bytes:
        import msgpack

        return msgpack.packb([time.time(), events], use_bin_type=True)

    def _flush(self, pub: object) -> None:
        """Send the pending events as one batch (caller holds the recorder's lock)."""
        events = self.recorder.take()
        if not events:
            return
        self.seq += 1
        payload = self._pack(events)
        self.buffer.append((self.seq, payload))
        pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])  # type: ignore[attr-defined]

    def _serve_replay(self, sock: object, pub: object) -> None:
        ident, _, raw = sock.recv_multipart()  # type: ignore[attr-defined]
        start = int.from_bytes(raw[:8], "big", signed=True) if len(raw) >= 8 else 0
        with self.recorder.lock:
            self._flush(pub)
            oldest = self.buffer[0][0] if self.buffer else self.seq + 1
            frames: list[tuple[int, bytes]] = []
            if start <= 0 or start < oldest or start > self.seq + 1:  # > : we restarted
                frames.append((self.seq, self._pack(self.recorder.snapshot())))
                start = self.seq + 1
            frames += [(s, p) for s, p in self.buffer if s >= start]
        for s, p in frames:
            sock.send_multipart([ident, b"", s.to_bytes(8, "big", signed=True), p])  # type: ignore[attr-defined]
        sock.send_multipart([ident, b"", END_SEQ, b""])  # type: ignore[attr-defined]

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        rep = ctx.socket(zmq.ROUTER) if self.replay else None
        try:
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(self.endpoint)
            if rep is not None:
                rep.setsockopt(zmq.LINGER, 0)
                rep.bind(self.replay)
        except zmq.ZMQError as e:
            self._error = e
            pub.close()
            if rep is not None:
                rep.close()
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        if rep is not None:
            poller.register(rep, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if rep is not None and dict(poller.poll(self.flush_s * 1e3)).get(rep):
                    self._serve_replay(rep, pub)
                elif rep is None:
                    time.sleep(self.flush_s)
                with self.recorder.lock:
                    self._flush(pub)
        except Exception:
            log.exception("KV event publisher stopped")
        finally:
            pub.close()
            if rep is not None:
                rep.close()
