"""Scripts beside the package, by purpose: ``benchmarks/`` (timings and memory), ``studies/`` (quality studies and
probes) and ``tools/`` (the demo, publishing). Each runs as a file, ``python scripts/<folder>/<name>.py``, and imports
the helpers of its own folder by name; ``bench_scale`` runs as ``python -m scripts.benchmarks.bench_scale`` from the
repository root, because it builds its data with the test suite's ``tests/tiny.py``."""
