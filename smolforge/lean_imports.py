"""scikit-learn imported when transformers first uses it, not when transformers loads.

Two transformers modules import ``sklearn.metrics`` at load time when scikit-learn is installed:
``transformers.generation.candidate_generator`` (``roc_curve``, for assisted generation's
confidence threshold), loaded with any model class, and ``transformers.data.metrics`` (the old GLUE
metrics), loaded with TRL's trainers. With scipy.stats and pandas that is about 0.9 s of each
stage process's 4-5 s start on 2 cores, for functions smolforge never calls; scikit-learn is
installed because lm-eval requires it. ``import smolforge`` installs a finder that loads those two
modules with the import skipped, then gives them stand-ins under the same names that import
scikit-learn on their first call. The modules behave as before (``is_sklearn_available()`` stays
true everywhere; the functions are scikit-learn's own), and a process that never calls them never
imports scikit-learn.

    >>> install(); install()   # idempotent: ``import smolforge`` has already called it

tests/test_lean_imports.py checks the stand-ins; test_ppo_stage.py, that a PPO step's process never loads scikit-learn.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable

__all__ = ["install"]

# module → the names it imports from sklearn.metrics at load time
DEFERRED = {"transformers.generation.candidate_generator": ("roc_curve",),
            "transformers.data.metrics": ("f1_score", "matthews_corrcoef")}


def sklearn_metric(name: str) -> Callable:
    """``sklearn.metrics.<name>``, imported on the first call."""
    def call(*args, **kwargs):
        import sklearn.metrics

        return getattr(sklearn.metrics, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class _DeferSklearn(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`DEFERRED` as the path finder would, and loads them with the import deferred."""

    def __init__(self) -> None:
        self.pending = set(DEFERRED)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        utils = sys.modules.get("transformers.utils")
        if spec is None or spec.loader is None or not hasattr(utils, "is_sklearn_available"):
            return spec
        truth = utils.is_sklearn_available
        if not truth():
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            utils.is_sklearn_available = lambda: False    # the module skips `from sklearn.metrics import …`
            try:
                execute(module)
            finally:
                utils.is_sklearn_available = truth
            module.is_sklearn_available = truth           # its own later checks see the truth
            for metric in DEFERRED[name]:
                setattr(module, metric, sklearn_metric(metric))

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (a no-op when it is there or the modules are loaded)."""
    if all(name in sys.modules for name in DEFERRED) or any(isinstance(f, _DeferSklearn) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _DeferSklearn())
