"""What outlives a request: the ledger (``ledger/``), the savings arithmetic (``savings/``), state
shared across requests and replicas (``state/``), the meaning guard's verdicts and trial budget
(``guard/``) and the provider cache models (``provider_models/``). ``README.md`` beside this
file: where each thing is, where a new one goes.
"""
