"""Where a request goes and how it survives a failing deployment (layer 4): the route and its
targets, load balance and prefix affinity, breakers, retries and fallbacks, the fan-out gate, probes.
"""
