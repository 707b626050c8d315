"""Scheduling and a step's execution (engine layer 2): a request's state (``sequence``), continuous
batching with chunked prefill and LPM admission (``scheduler``), slot allocation against the radix
tree (``kv_manager``), packing a step into tensors (``model_runner``), sampling, detokenizing,
tool-call state, the facade's data contract (``api_types``) and the step loop's commands.
"""

__all__ = [
    "api_types", "detokenizer", "engine_commands", "kv_manager", "model_runner", "sampler",
    "scheduler", "sequence", "tool_call_state",
]
