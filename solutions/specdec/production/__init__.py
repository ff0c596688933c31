"""Notebook 13, speculation in production: proposers and constraints that real serving stacks add
(suffix decoding; prefix caching lives with the engine in :mod:`specdec.serving.prefix_cache`)."""
