"""The proxy as a client of its backends (layer 2): the pooled upstream client and the stream relay
that times and reads an answer event by event.
"""
