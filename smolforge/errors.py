"""The four error families smolforge raises on bad input.

Each is caught once at the CLI edge and printed as ``RecipeError: <message>`` on stderr,
without a traceback unless ``--debug`` is given; the process exits with code 2.

    >>> from smolforge.errors import RecipeError, SmolforgeError
    >>> issubclass(RecipeError, SmolforgeError)
    True
    >>> str(RecipeError("recipes/demo/dpo.yaml: unknown key 'trainer.betta'"))
    "recipes/demo/dpo.yaml: unknown key 'trainer.betta'"
"""
from __future__ import annotations

__all__ = ["SmolforgeError", "RecipeError", "DataError", "RunError", "ServiceError", "Preempted", "Terminated"]


class SmolforgeError(Exception):
    """Base of every error that is the user's to fix (printed without a traceback)."""


class RecipeError(SmolforgeError):
    """A recipe (YAML file, override, CLI flag) cannot work: unknown key, wrong type, missing field."""


class DataError(SmolforgeError):
    """Input data is missing or malformed; the message names the file, row and field."""


class RunError(SmolforgeError):
    """A run folder is missing, failed, still running, or would be overwritten."""


class ServiceError(SmolforgeError):
    """An external service (vLLM server, Argilla, ...) could not be started or reached."""


class Preempted(SmolforgeError):
    """The stage checkpointed and stopped because its job asked (a Slurm time limit is near); the run
    stays unfinished and the same command resumes it."""


class Terminated(BaseException):
    """SIGTERM arrived (``scancel``, a launcher stopping its ranks): unwind so the run is marked failed
    and the processes a stage started are stopped, instead of dying with the run left ``running``."""
