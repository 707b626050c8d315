"""One model request, for every endpoint (layer 6): prepare -> send -> answer -> record.
"""

from __future__ import annotations

from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.run import run

__all__ = ["Endpoint", "Exchange", "ProxyState", "run"]
