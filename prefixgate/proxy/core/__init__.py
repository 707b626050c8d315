"""The proxy's vocabulary (layer 0): errors in the callers' API shapes, exact JSON numbers, SSE
framing, usage readers, log redaction. Imports nothing else of ``prefixgate.proxy``.
"""

from __future__ import annotations

from prefixgate.proxy.core.errors import Api, ProxyError, error_response
from prefixgate.proxy.core.sse import EventMapper, SSEEvent
from prefixgate.proxy.core.usage import StreamWatcher, Usage

__all__ = ["Api", "EventMapper", "ProxyError", "SSEEvent", "StreamWatcher", "Usage", "error_response"]
