"""The differential-testing harness: registry, bit patterns, comparators, invariance drivers,
negative controls, reports, the CLI and the pytest plugin.

Importing this package never imports vllm or flashinfer (a test checks it).
"""
