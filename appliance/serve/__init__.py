"""The inference server: app.py (HTTP) -> runtime.py (what serves) -> batching.py (how it runs).

metrics.py and drift.py watch it; tls.py gives it a certificate when none is supplied.
"""
