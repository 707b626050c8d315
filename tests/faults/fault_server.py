"""A fault-injecting upstream: a raw asyncio HTTP/1.1 server on 127.0.0.1 (not a mock transport).

Raw sockets, not a framework, so that every fault is exactly what reaches the proxy's TCP stack:
a reset (RST, ``SO_LINGER`` 0) before or after the first byte, a stall, one byte per write. The
request's ``model`` (its last ``/`` part, ``claude-`` prefix removed) picks the behaviour; the path picks the API
(``/v1/messages`` answers in Anthropic's shape, anything else in OpenAI's)::

    ok              a proper answer (SSE when ``stream`` is true, else JSON), keep-alive
    drip            a proper stream whose bytes trickle in pieces of 7 with a short pause
    one-byte        a proper stream, one byte per chunk, one chunk per write
    reset-before    the request is read, then the connection is reset before any byte
    reset-after     status line, headers and the first event (or half the JSON), then a reset
    status-429      429 with ``retry-after: 7`` and an error body in the API's shape
    status-500      500 with an error body;  status-529: 529 (Anthropic's "overloaded");
                    any ``status-NNN`` works; ``status-NNN-raS``: with ``retry-after: S``
    huge-error      500 with a 4 MiB JSON error body
    stall-before    nothing at all for ``stall_s`` (past the backend's timeout)
    stall-after     headers and the first event, then nothing for ``stall_s`` (or until the
                    peer hangs up)
    garbage         events that are not JSON / not UTF-8, then a proper end
    truncated       the first event, then half an event, then a clean end of body: no final event
    upstream-error  the first event, then the API's own error event, then a clean end
    delay-headers   waits up to ``stall_s`` before its headers, watching the socket: a peer that
                    hangs up first is counted in ``cancelled`` (the request was abandoned)
    bad-usage-hdr   a proper answer whose ``x-engine-cached-tokens`` header is not a number
    barrier         a proper stream, held after its first event until ``barrier_n`` barrier
                    requests have arrived (round after round): proof they were all open at once

Counters (read from the test thread): ``requests`` received, ``cancelled`` (see delay-headers),
``finished`` answers written to the end. ``force``: a fault answered to every request whatever
its model (a deployment that is down); ``script``: ``{name: [fault, ...]}``, model ``seq/<name>``
takes the next fault of the list (the last one repeats): a deployment that recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

OPENAI_EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"hel"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n',
]
OPENAI_END = b"data: [DONE]\n\n"
OPENAI_ERROR = b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'

ANTHROPIC_EVENTS = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":'
    b'"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":5,'
    b'"output_tokens":1}}}\n\n',
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hello"}}\n\n',
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":2}}\n\n',
]
ANTHROPIC_END = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
ANTHROPIC_ERROR = (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                   b'"message":"Overloaded"}}\n\n')

GARBAGE = [b"data: {not json\n\n", b"data: \xff\xfe\xfd\n\n", b"data: 5\n\n",
           b": a comment\n\n", b"event: x\n\n", b'data: {"choices": 7, "type": 9}\n\n']


def _json_answer(anthropic: bool) -> bytes:
    if anthropic:
        return json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                           "content": [{"type": "text", "text": "hello"}],
                           "stop_reason": "end_turn",
                           "usage": {"input_tokens": 5, "output_tokens": 2}}).encode()
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "hello"}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                 "total_tokens": 7}}).encode()


def _error_body(anthropic: bool, status: int) -> bytes:
    if anthropic:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": "no"}}).encode()
    return json.dumps({"error": {"message": "no", "type": "server_error", "param": None,
                                 "code": None}}).encode()


@dataclass
class _Req:
    path: str
    body: dict[str, Any]

    @property
    def anthropic(self) -> bool:
        return self.path.endswith("/messages")

    @property
    def fault(self) -> str:
        return str(self.body.get("model", "ok")).split("/")[-1].removeprefix("claude-")

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    def events(self) -> tuple[list[bytes], bytes, bytes]:
        """(content events, final event, the API's own error event)."""
        if self.anthropic:
            return ANTHROPIC_EVENTS, ANTHROPIC_END, ANTHROPIC_ERROR
        return OPENAI_EVENTS, OPENAI_END, OPENAI_ERROR


def _head(status: int, media: str, *, length: int | None = None,
          extra: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"content-type: {media}"]
    lines.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN (linger on, timeout 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FaultServer:
    """See module docstring. ``stall_s``: how long stalls and delayed headers last (seconds);
    ``drip_pause_s``: the pause between drip pieces."""

    stall_s: float = 5.0
    drip_pause_s: float = 0.002
    barrier_n: int = 1
    requests: int = 0
    cancelled: int = 0
    finished: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _arrived: int = 0  # barrier requests so far; touched on the server's loop only
    _gates: dict[int, asyncio.Event] = field(default_factory=dict)
    force: str | None = None
    script: dict[str, list[str]] = field(default_factory=dict)

    def _pick(self, fault: str, model: str) -> str:
        """The fault to answer: ``force``, the next of a ``seq/`` script, or the model's."""
        if self.force is not None:
            return self.force
        if model.startswith("seq/"):
            with self._lock:
                steps = self.script[model[4:]]
                return steps.pop(0) if len(steps) > 1 else steps[0]
        return fault

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until either side closes it."""
        try:
            while True:
                req = await self._read(reader)
                if req is None:
                    break
                self._count("requests")
                if not await self._answer(req, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> _Req | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        raw = await reader.readexactly(length)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        return _Req(path, body if isinstance(body, dict) else {})

    async def _answer(self, req: _Req, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Write the fault's answer; False when the connection is finished with."""
        fault = self._pick(req.fault, str(req.body.get("model", "")))
        events, end, err = req.events()
        if fault == "reset-before":
            _reset(writer)
            return False
        if fault in ("stall-before", "delay-headers"):
            if await self._until_hang_up(reader):
                self._count("cancelled")
                return False
            fault = "ok"
        if fault.startswith("status-") or fault == "huge-error":
            code, _, ra = fault[7:].partition("-ra")
            status = 500 if fault == "huge-error" else int(code)
            body = _error_body(req.anthropic, status)
            if fault == "huge-error":
                body = body.replace(b'"no"', b'"' + b"x" * (4 << 20) + b'"')
            ra = ra or ("7" if status == 429 else "")
            writer.write(_head(status, "application/json", length=len(body),
                               extra={"retry-after": ra} if ra else None) + body)
            await writer.drain()
            self._count("finished")
            return True
        extra = {"x-engine-cached-tokens": "\u00b2"} if fault == "bad-usage-hdr" else None
        if not req.stream:
            body = _json_answer(req.anthropic)
            if fault == "reset-after":
                writer.write(_head(200, "application/json", length=len(body)) + body[:20])
                await writer.drain()
                _reset(writer)
                return False
            writer.write(_head(200, "application/json", length=len(body),
                               extra=extra) + body)
            await writer.drain()
            self._count("finished")
            return True
        writer.write(_head(200, "text/event-stream", extra=extra))
        plan = self._plan(fault, events, end, err)
        if plan is None:  # reset-after / stall-after: the first event, then the fault
            writer.write(_chunk(events[0]))
            await writer.drain()
            if fault == "reset-after":
                _reset(writer)
                return False
            await self._until_hang_up(reader)
            return False
        if fault == "barrier":
            writer.write(_chunk(plan[0]))
            await writer.drain()
            await self._barrier()
            plan = plan[1:]
        data = b"".join(plan)
        if fault == "one-byte":
            for i in range(len(data)):
                writer.write(_chunk(data[i:i + 1]))
                await writer.drain()
        elif fault == "drip":
            for i in range(0, len(data), 7):
                writer.write(_chunk(data[i:i + 7]))
                await writer.drain()
                await asyncio.sleep(self.drip_pause_s)
        else:
            writer.write(_chunk(data))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self._count("finished")
        return True

    async def _until_hang_up(self, reader: asyncio.StreamReader) -> bool:
        """Wait up to ``stall_s`` for the peer to hang up; True if it did. A well-behaved peer
        sends nothing while waiting for an answer: any read result means it went away."""
        try:
            await asyncio.wait_for(reader.read(1), self.stall_s)
            return True
        except TimeoutError:
            return False

    async def _barrier(self) -> None:
        """Wait until this request's round of ``barrier_n`` has all arrived (or ``stall_s``)."""
        self._arrived += 1
        target = -(-self._arrived // self.barrier_n) * self.barrier_n
        gate = self._gates.setdefault(target, asyncio.Event())
        if self._arrived >= target:
            gate.set()
        await asyncio.wait_for(gate.wait(), self.stall_s)

    @staticmethod
    def _plan(fault: str, events: list[bytes], end: bytes, err: bytes) -> list[bytes] | None:
        if fault in ("reset-after", "stall-after"):
            return None
        if fault == "garbage":
            return [events[0], *GARBAGE, *events[1:], end]
        if fault == "truncated":
            return [events[0], events[1][: len(events[1]) // 2]]
        if fault == "upstream-error":
            return [events[0], err]
        return [*events, end]


@contextlib.contextmanager
def serve_faults(server: FaultServer) -> Iterator[str]:
    """Run ``server`` on a free 127.0.0.1 port in a background thread; yield its base URL
    (``http://127.0.0.1:PORT``). The listen backlog is 2048 so hundreds of simultaneous
    connects are queued, not refused."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=2048)
        holder["srv"], holder["port"] = srv, srv.sockets[0].getsockname()[1]
        started.set()
        async with srv:
            await srv.serve_forever()

    def run() -> None:
        asyncio.set_event_loop(loop)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("fault server did not start")
    try:
        yield f"http://127.0.0.1:{holder['port']}"
    finally:
        def stop() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()

        loop.call_soon_threadsafe(stop)
        thread.join(timeout=10)
