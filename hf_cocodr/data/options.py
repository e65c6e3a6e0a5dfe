"""Choices of the data options that the command line offers, importable without numpy or pyarrow (``--help``
lists them)."""

PSEUDO_PAIR_MODES = ("title_body", "ict")  # how target pseudo pairs are made (:mod:`hf_cocodr.data.pseudo_pairs`)
