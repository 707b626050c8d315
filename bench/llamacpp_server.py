"""Serve a GGUF with llama.cpp's own server (PyPI ``xllamacpp``, prebuilt) until terminated.

``python bench/llamacpp_server.py --gguf FILE --port P [--threads 2] [--ctx 8192]``

llama.cpp's server is OpenAI-compatible (``/v1/chat/completions``, ``/health``), applies the
GGUF's chat template, and keeps each slot's KV for prompt-prefix reuse (``cache_prompt``), so
it is the CPU peer the local engine is compared with. One slot (``n_parallel=1``) unless
``--parallel`` says otherwise.
"""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    """Start the server, block until SIGTERM / SIGINT."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--cache-ram", type=int, default=None,
                    help="MiB of host RAM for llama.cpp's prompt cache (its --cache-ram; 0: off, "
                         "as before llama.cpp PR 16391; unset: the build's default)")
    ap.add_argument("--poll", type=int, default=50,
                    help="llama.cpp threadpool busy-poll level 0-100 (llama.cpp's default 50)")
    args = ap.parse_args()

    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.gguf
    p.n_ctx = args.ctx * args.parallel  # llama.cpp splits n_ctx across slots
    p.n_parallel = args.parallel
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.cpuparams.poll = args.poll
    p.cpuparams_batch.poll = args.poll
    p.hostnames = ["127.0.0.1"]
    p.port = args.port
    p.cache_prompt = True
    if args.cache_ram is not None:
        p.cache_ram_mib = args.cache_ram
    server = xllamacpp.Server(p)
    print("llama.cpp listening on", server.listening_address, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    del server


if __name__ == "__main__":
    main()
