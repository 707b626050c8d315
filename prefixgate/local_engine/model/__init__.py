"""The model (engine layer 1): the Llama-family forward, ragged attention over pool slots, model
files (tokenizer, EOS ids, dtypes), fetching the default model, and ``quant/`` (int8, packed CPU
linears, the screened LM head). Imports only ``kv`` (the pool the forward writes).
"""

__all__ = ["attention", "fetch", "files", "llama", "quant"]
