"""Differential fuzzing of the whole proxy (issue 8, "Tests").

- ``test_differential.py`` — 10,000 seeded bodies per run (``PREFIXGATE_FUZZ_BODIES`` lowers it
  locally) over both APIs and both bridges, every rewrite pass on, against a recording upstream;
  checks in ``check.py`` (status, shapes, upstream validity, meaning, numbers, records).
- ``test_schemathesis.py`` — schemathesis over ``/openapi.json`` for both model endpoints.
- ``known_defects.py`` — ``KNOWN_DEFECTS``: defect classes found in the current code, each with a
  reproducer; ``test_known_defects.py`` fails when one no longer reproduces (remove its entry).
- ``test_checkers.py`` — the checkers catch what they claim to.

Reproduce one fuzz body: ``tests.fuzz.check.make_case(seed, path)`` with the seed and path a
failure prints.
"""
