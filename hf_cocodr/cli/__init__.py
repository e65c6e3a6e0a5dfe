"""The ``hf-cocodr`` command line: the parser and the evaluation/export commands (:mod:`~hf_cocodr.cli.main`); the
training commands (:mod:`~hf_cocodr.cli.training`), Hub commands (:mod:`~hf_cocodr.cli.hub`) and MTEB commands
(:mod:`~hf_cocodr.cli.mteb`) register themselves when a command line needs them. Importing it loads nothing heavy."""

from .main import COMMANDS, Command, UsageError, add_overwrite_flag, build_parser, main, register

__all__ = ["COMMANDS", "Command", "UsageError", "add_overwrite_flag", "build_parser", "main", "register"]
