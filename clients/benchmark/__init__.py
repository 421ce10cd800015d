"""The pieces of ``clients/bench.py``: load generation (``workload``), spawned servers
(``servers``), transformers baselines (``baselines``), reporting (``report``).

Run as ``python clients/bench.py``; the package is found next to it, no install needed.
"""
