"""Offline: traces, the cache simulator, think time, the fan-out simulator. Nothing on the serving
path imports it.
"""

from __future__ import annotations

from prefixgate.proxy.sim.simulate import SimConfig
from prefixgate.proxy.sim.traces import load_trace

__all__ = ["SimConfig", "load_trace"]
