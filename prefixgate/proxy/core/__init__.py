"""The proxy's vocabulary (layer 0): errors in the callers' API shapes, exact JSON numbers, SSE
framing, usage readers, log redaction. Imports nothing else of ``prefixgate.proxy``.
"""
