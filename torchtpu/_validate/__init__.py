"""Helpers of `python -m torchtpu.validate`: model enumeration and builders (models.py),
the per-model CPU-vs-tpu run (runner.py), the worker subprocess (worker.py), the pool
(pool.py) and the docs/validation.md renderer (report.py)."""
