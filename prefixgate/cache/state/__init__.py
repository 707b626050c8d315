"""What outlives a request and is shared across requests and replicas: sessions (memory and Redis),
shared state, the Redis link and the Responses store.
"""

__all__ = ["redis_link", "responses_store", "session", "session_redis", "shared_state"]
