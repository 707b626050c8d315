"""Where a request goes and how it survives a failing deployment (layer 4): the route and its
targets, load balance and prefix affinity, breakers, retries and fallbacks, the fan-out gate, probes,
the engines' KV events, and P/D disaggregation (``pd/``).
"""

from __future__ import annotations

from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.fanout import FanoutGate
from prefixgate.proxy.routing.retries import Attempts, Picked, Sender, Step
from prefixgate.proxy.routing.router import Target, plan_targets

__all__ = ["Attempts", "Balancer", "BreakerBoard", "FanoutGate", "Picked", "Sender", "Step", "Target",
           "plan_targets"]
