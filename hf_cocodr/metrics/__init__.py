"""Metric scripts in the `evaluate` library's format, shipped as package data.

Load them with :func:`evaluate.load` on their path, e.g. through
:func:`hf_cocodr.evaluation.evaluator.load_retrieval_metric`.
"""
