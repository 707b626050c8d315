"""The proxy as a client of its backends (layer 2): the pooled upstream client and the stream relay
that times and reads an answer event by event.
"""

from __future__ import annotations

from prefixgate.proxy.upstream.client import Upstream, send_unless_gone
from prefixgate.proxy.upstream.relay import SSEResponse, StreamRelay, Timing

__all__ = ["SSEResponse", "StreamRelay", "Timing", "Upstream", "send_unless_gone"]
