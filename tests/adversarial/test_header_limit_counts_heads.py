"""Issue 20 High 1: the header size limit counts request line + header bytes only, however the
bytes arrive — head and body in one read, a head over many reads, pipelined requests in one read
(chunked or sized bodies) — and still refuses heads that are genuinely too large.

The protocol is driven directly (:class:`FakeTransport`), so each case controls exactly which
bytes arrive in which read; ``test_header_limit_sockets.py`` holds the raw-socket cases."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from prefixgate.config.schema import Limits
from prefixgate.proxy.http.server import ChunkedEnd, guarded_protocol, head_end

LIMIT = 1024


class FakeTransport:
    """What the protocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, p: Any) -> None:
        self.protocol = p

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def set_write_buffer_limits(self, *a: Any) -> None: ...


async def echo_length(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """200 with ``<path> <body bytes>`` as the body."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        msg = await receive()
        size += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = f"{scope['path']} {size}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def responses(out: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each complete response in ``out`` (content-length framed)."""
    got, rest = [], bytes(out)
    while b"\r\n\r\n" in rest:
        head, rest = rest.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        length = next(int(v) for k, _, v in (ln.partition(b": ") for ln in lines[1:])
                      if k.lower() == b"content-length")
        got.append((int(lines[0].split(b" ")[1]), rest[:length]))
        rest = rest[length:]
    return got


async def _serve(reads: Sequence[bytes], limit: int = LIMIT) -> tuple[list[tuple[int, bytes]], bool]:
    cls = guarded_protocol(Limits(max_header_bytes=limit, header_timeout_s=5))
    proto = cls(Config(app=echo_length, log_level="critical"), ServerState(), {},
                asyncio.get_running_loop())
    t = FakeTransport()
    t.protocol = proto
    proto.connection_made(t)  # type: ignore[arg-type]
    for r in reads:
        if t.closed:
            break
        proto.data_received(r)
        for _ in range(20):  # let the app answer (pipelined requests run one after another)
            await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    closed = t.closed
    proto.connection_lost(None)
    return responses(bytes(t.out)), closed


def serve(reads: Sequence[bytes], limit: int = LIMIT) -> tuple[list[tuple[int, bytes]], bool]:
    """Feed ``reads`` one ``data_received`` each; (responses, connection closed)."""
    return asyncio.run(_serve(reads, limit))


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def chunked(path: str, parts: Sequence[bytes], trailer: bytes = b"") -> bytes:
    out = b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    for i, p in enumerate(parts):
        out += b"%x;ext=%d\r\n" % (len(p), i) + p + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def get(path: str, extra: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n" + extra + b"\r\n"


@pytest.mark.parametrize("body_size", [LIMIT + 1, 70_000, 330_000])
def test_small_head_with_a_large_body_in_one_read_is_served(body_size: int) -> None:
    got, _ = serve([post("/v1/chat/completions", b"x" * body_size)])
    assert got == [(200, b"/v1/chat/completions %d" % body_size)]


def test_head_and_body_cut_at_every_offset_are_served() -> None:
    req = post("/a", b"y" * 3000)  # the head is ~90 bytes, the body over the limit
    head_len = req.index(b"\r\n\r\n") + 4
    for cut in [*range(1, head_len + 3), LIMIT - 1, LIMIT, LIMIT + 1, len(req) - 1]:
        got, _ = serve([req[:cut], req[cut:]])
        assert got == [(200, b"/a 3000")], cut


def test_a_head_one_byte_per_read_is_served() -> None:
    req = post("/b", b"z" * 2000)
    head_len = req.index(b"\r\n\r\n") + 4
    got, _ = serve([req[i:i + 1] for i in range(head_len)] + [req[head_len:]])
    assert got == [(200, b"/b 2000")]


def _head_of(size: int) -> bytes:
    """A GET head of exactly ``size`` bytes (request line + headers + blank line)."""
    base = get("/c", b"x-pad: \r\n")
    return base.replace(b"x-pad: ", b"x-pad: " + b"p" * (size - len(base)))


@pytest.mark.parametrize("reads", [1, 7])
def test_a_head_of_exactly_the_limit_is_served_one_byte_more_is_431(reads: int) -> None:
    for size, status in ((LIMIT, 200), (LIMIT + 1, 431)):
        head = _head_of(size)
        assert len(head) == size
        step = -(-size // reads)
        got, closed = serve([head[i:i + step] for i in range(0, size, step)])
        assert [s for s, _ in got] == [status], size
        assert closed is (status == 431)


def test_large_headers_without_their_end_are_431_before_the_end_arrives() -> None:
    head = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (4 * LIMIT)
    got, closed = serve([head[i:i + 100] for i in range(0, len(head), 100)])
    assert [s for s, _ in got] == [431] and closed
    assert b'"type":"error"' in got[0][1]  # the Anthropic shape, from the request line's path


def test_two_pipelined_requests_with_bodies_in_one_read_are_both_served() -> None:
    got, _ = serve([post("/one", b"a" * 70_000) + post("/two", b"b" * 5)])
    assert got == [(200, b"/one 70000"), (200, b"/two 5")]


def test_pipelined_head_after_a_body_counts_from_its_own_first_byte() -> None:
    # not named by the issue: a second head in the same read as a large body, exactly at the
    # limit (served) and one byte over it (431): its bytes are counted, the body's are not
    first = post("/one", b"a" * 50_000)
    at_limit = serve([first + _head_of(LIMIT)])[0]
    assert at_limit == [(200, b"/one 50000"), (200, b"/c 0")]
    over = serve([first + _head_of(LIMIT + 1)])[0]
    assert over == [(200, b"/one 50000"), (431, over[1][1])]


def test_pipelined_chunked_bodies_with_extensions_and_trailers_are_served() -> None:
    # not named by the issue: chunked bodies (chunk extensions, trailer fields) followed by
    # more requests in the same read
    one = chunked("/one", [b"a" * 40_000, b"b" * 30_000], trailer=b"x-t: 1\r\n")
    data = one + chunked("/two", [b"c" * 10]) + get("/three")
    got, _ = serve([data])
    assert got == [(200, b"/one 70000"), (200, b"/two 10"), (200, b"/three 0")]
    assert serve([data[i:i + 333] for i in range(0, len(data), 333)])[0] == got


def test_many_pipelined_requests_cut_at_random_offsets_are_all_served() -> None:
    rng = random.Random(20)
    reqs = [post(f"/p{i}", b"q" * rng.choice([0, 10, 2000, 80_000])) if i % 3 else
            chunked(f"/p{i}", [b"r" * rng.choice([1, 1500])] * 3) if i % 2 else get(f"/p{i}")
            for i in range(12)]
    data = b"".join(reqs)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(data)), 30))
        reads = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        got, _ = serve(reads)
        assert [s for s, _ in got] == [200] * 12


def test_head_end_finds_a_blank_line_split_across_reads() -> None:
    assert head_end(b"", b"GET / HTTP/1.1\r\n\r\nrest", 0, 100) == 18
    assert head_end(b"x\r\n", b"\r\nrest", 0, 6) == 2
    assert head_end(b"\r\n\r", b"\nrest", 0, 5) == 1
    assert head_end(b"\r\n", b"\r\n", 0, 1) == -1  # the end would fall past ``stop``
    assert head_end(b"", b"a\r\n\r\n", 0, 4) == -1


def test_chunked_end_reads_across_reads_and_flags_what_it_cannot_read() -> None:
    body = b"4;x=1\r\nabcd\r\n0\r\nt: 1\r\n\r\nNEXT"
    c = ChunkedEnd()
    assert c.scan(body, 0) == len(body) - 4
    c, ends = ChunkedEnd(), []
    for i in range(len(body)):
        e = c.scan(body[i:i + 1], 0)
        ends.append(e)
        if c.done:
            break
    assert ends[-1] == 1 and len(ends) == len(body) - 4
    bad = ChunkedEnd()
    assert bad.scan(b"zz\r\n", 0) == -1 and bad.bad


def test_a_garbage_chunk_size_is_answered_400_not_counted_as_a_head() -> None:
    bad = b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    got, closed = serve([bad])
    assert [s for s, _ in got] == [400] and closed
