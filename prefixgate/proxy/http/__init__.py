"""What a connection and its request pass before any proxy logic (layer 1): the HTTP server's
limits, path middleware, body reading and checks, header hygiene, proxy keys, rate limits, tenants.
"""
