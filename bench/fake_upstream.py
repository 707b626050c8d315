"""A fast fake OpenAI-compatible upstream for overhead benchmarks (raw asyncio, keep-alive).

    python bench/fake_upstream.py [--port 0] [--chunks 8]

Prints ``PORT <n>`` once listening. ``POST .../chat/completions``: a ``chat.completion`` JSON
answer, or, when the body holds ``"stream":true`` (or ``"stream": true``), ``--chunks``
Chat Completions chunks + a usage chunk + ``[DONE]`` as one ``text/event-stream`` body
(Content-Length framed: the whole answer leaves in one write, so what a proxy adds to the first
chunk is what it adds to the response head and first event). ``GET .../models``: one model.
The request body is read (Content-Length) and otherwise ignored. No framework: the upstream must
not be the bottleneck of a ``wrk`` run on a small machine (uvicorn + Starlette top out near the
proxy's own rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

COMPLETION = json.dumps({
    "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11,
              "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                 "owned_by": "fake"}]}).encode()


def sse_body(chunks: int) -> bytes:
    """``chunks`` content chunks, a usage chunk and ``[DONE]``."""
    out = []
    for i in range(chunks):
        obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
        out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
    usage = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": chunks,
                                      "total_tokens": 10 + chunks}}
    out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def response(status: str, ctype: bytes, body: bytes) -> bytes:
    """A complete keep-alive HTTP/1.1 response."""
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype
            + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class FakeUpstream(asyncio.Protocol):
    """One client connection: parse request heads + Content-Length bodies, answer each."""

    def __init__(self, stream_body: bytes) -> None:
        self.buf = b""
        self.stream_resp = response("200 OK", b"text/event-stream", stream_body)
        self.json_resp = response("200 OK", b"application/json", COMPLETION)
        self.models_resp = response("200 OK", b"application/json", MODELS)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            assert self.transport is not None
            self.transport.write(self.answer(head.split(" ", 2), body))

    def answer(self, line: list[str], body: bytes) -> bytes:
        """The response to one request."""
        path = line[1] if len(line) > 1 else "/"
        if line[0] == "GET" and path.endswith("/models"):
            return self.models_resp
        if path.endswith("/chat/completions"):
            streamed = b'"stream":true' in body or b'"stream": true' in body
            return self.stream_resp if streamed else self.json_resp
        return response("404 Not Found", b"application/json", b'{"error":"not found"}')


async def serve(port: int, chunks: int) -> None:
    """Listen on 127.0.0.1:``port`` and print ``PORT <n>``."""
    loop = asyncio.get_running_loop()
    body = sse_body(chunks)
    server = await loop.create_server(lambda: FakeUpstream(body), "127.0.0.1", port,
                                      backlog=1024)
    print("PORT", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Run until killed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--chunks", type=int, default=8)
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    if os.environ.get("FAKE_UPSTREAM_QUIET"):
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the process's lifetime
    asyncio.run(serve(args.port, args.chunks))


if __name__ == "__main__":
    main()
