"""Offline: traces, the cache simulator, think time, the fan-out simulator. Nothing on the serving
path imports it.
"""
