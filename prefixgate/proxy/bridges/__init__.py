"""One bridge per (client API, backend API) pair (layer 3): dicts and bytes only, no HTTP.
"""
