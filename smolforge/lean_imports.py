"""scikit-learn and scipy imported when transformers first uses them, not when transformers loads; vLLM
when TRL first builds its in-process generation, not when its online trainers load.

Two transformers modules import ``sklearn.metrics`` at load time when scikit-learn is installed:
``transformers.generation.candidate_generator`` (``roc_curve``, for assisted generation's
confidence threshold), loaded with any model class, and ``transformers.data.metrics`` (the old GLUE
metrics), loaded with TRL's trainers. With scipy.stats and pandas that is about 0.9 s of each
stage process's 4-5 s start on 2 cores, for functions smolforge never calls; scikit-learn is
installed because lm-eval requires it. Six object-detection losses (``transformers.loss.loss_*``, the
DETR family's Hungarian matching), also loaded with any model class, import ``scipy.optimize``:
another 0.3-0.4 s of every process that loads a model (7.5 → 7.1 s for an SFT process's imports).
``import smolforge`` installs a finder that loads those modules with the import skipped, then gives
them stand-ins under the same names that import the library on their first call. The modules behave
as before (``is_sklearn_available()`` and ``is_scipy_available()`` stay true everywhere; the functions
are the libraries' own), and a process that never calls them never imports scikit-learn or scipy's
optimizers.

    >>> install(); install()   # idempotent: ``import smolforge`` has already called it

The same holds for vLLM in TRL's online trainers: ``trl.generation.vllm_generation`` (imported by
GRPO, RLOO and distillation at load time; it imports vLLM, about 5 s of a 13 s ``from trl import
GRPOTrainer``) becomes a stand-in whose ``VLLMGeneration``, built only with ``use_vllm``, loads the real
module first; smolforge's own rollouts (HF, or its vLLM server) never build it.

tests/test_lean_imports.py checks the stand-ins; test_ppo_stage.py, that a PPO step's process never loads scikit-learn.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["install"]

# transformers module → (the availability check it consults, the module it imports from, the names) at load time
DEFERRED = {"transformers.generation.candidate_generator": ("is_sklearn_available", "sklearn.metrics", ("roc_curve",)),
            "transformers.data.metrics": ("is_sklearn_available", "sklearn.metrics", ("f1_score", "matthews_corrcoef")),
            # the object-detection losses (DETR-family Hungarian matching), loaded with every model class
            **{f"transformers.loss.loss_{family}": ("is_scipy_available", "scipy.optimize", ("linear_sum_assignment",))
               for family in ("for_object_detection", "deformable_detr", "grounding_dino", "lw_detr", "rf_detr",
                              "rt_detr")}}


def deferred_function(module: str, name: str) -> Callable:
    """``<module>.<name>`` (``sklearn.metrics.roc_curve``), imported on the first call."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

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
        check, source, names = DEFERRED[name]
        utils = sys.modules.get("transformers.utils")
        if spec is None or spec.loader is None or not hasattr(utils, check):
            return spec
        truth = getattr(utils, check)
        if not truth():
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            setattr(utils, check, lambda: False)    # the module skips `from <source> import …`
            try:
                execute(module)
            finally:
                setattr(utils, check, truth)
            setattr(module, check, truth)           # its own later checks see the truth
            for function in names:
                setattr(module, function, deferred_function(source, function))

        spec.loader.exec_module = exec_module
        return spec


# TRL's online trainers (GRPO, RLOO, distillation) import its in-process vLLM generation at load time,
# which imports vLLM (about 5 s of a 13 s `from trl import GRPOTrainer` on 2 cores) even where generation
# goes through HF or smolforge's own vLLM server; its one class is built only with `use_vllm`.
VLLM_GENERATION = "trl.generation.vllm_generation"


def _real_vllm_generation():
    """TRL's own ``vllm_generation`` module, loaded now in place of the stand-in (vLLM imported with it)."""
    module = sys.modules.get(VLLM_GENERATION)
    if module is not None and not getattr(module, "_smolforge_stand_in", False):
        return module
    spec = importlib.machinery.PathFinder.find_spec(VLLM_GENERATION, sys.modules["trl.generation"].__path__)
    real = importlib.util.module_from_spec(spec)
    sys.modules[VLLM_GENERATION] = real
    try:
        spec.loader.exec_module(real)
    except BaseException:
        sys.modules[VLLM_GENERATION] = module
        raise
    setattr(sys.modules["trl.generation"], "vllm_generation", real)
    return real


class _VLLMGenerationStandIn:
    """Stands in for ``trl.generation.vllm_generation.VLLMGeneration`` until a trainer builds one."""

    def __new__(cls, *args, **kwargs):
        return _real_vllm_generation().VLLMGeneration(*args, **kwargs)


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module._smolforge_stand_in = True
        module.VLLMGeneration = _VLLMGenerationStandIn
        module.__getattr__ = _forward


def _forward(name: str):
    """Any other name of the stand-in module: the real module's (dunder lookups of the import machinery,
    such as ``__path__``, are answered as for a plain module and load nothing)."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return getattr(_real_vllm_generation(), name)


class _DeferVLLMGeneration(importlib.abc.MetaPathFinder):
    """Gives ``trl.generation.vllm_generation`` a stand-in whose ``VLLMGeneration`` (and any other name it
    is asked for) loads TRL's module, and vLLM with it, on first use."""

    def find_spec(self, name, path=None, target=None):
        if name != VLLM_GENERATION:
            return None
        sys.meta_path.remove(self)
        real = importlib.machinery.PathFinder.find_spec(name, path, target)
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(name, _StandInLoader(), origin=real.origin)


# transformers' table of every class it loads lazily (``define_import_structure`` over transformers/models:
# about 1,000 folders and 3,000 files read and scanned for ``__all__``, twice: for the package and for
# ``transformers.models``) is built anew in every process that imports transformers; it depends only on
# the installed files, so it is kept in a cache file named after them.
IMPORT_UTILS = "transformers.utils.import_utils"


def structure_cache_file(module_path, prefix: str | None) -> Path | None:
    """Where the import structure of ``module_path`` (transformers' ``models`` folder, or a file in it) with
    ``prefix`` is cached: a name drawn from the folder, the prefix, Python's version and the identity (inode,
    size, mtime) of what decides the table (the folder and each model folder in it, ``transformers/__init__.py``,
    ``import_utils.py``): a reinstall or an added model makes a new name. None for any other folder (the
    per-model tables are small)."""
    folder = Path(module_path)
    folder = folder if folder.is_dir() else folder.parent
    if folder.name != "models" or folder.parent.name != "transformers":
        return None
    files = [folder, folder.parent / "__init__.py", folder.parent / "utils" / "import_utils.py"]
    with os.scandir(folder) as entries:      # a model folder added, removed or rewritten
        files += sorted(entry.path for entry in entries if entry.is_dir())
    identity = [(s.st_ino, s.st_size, s.st_mtime_ns) for s in map(os.stat, files)]
    key = repr((str(folder), prefix, sys.version_info[:2], identity)).encode()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smolforge" / "import-structure"
    return cache / f"transformers-{hashlib.sha256(key).hexdigest()[:32]}.marshal"


def cached_structures(define: Callable) -> Callable:
    """``define_import_structure`` read from its cache file where one exists (written, atomically, where
    none does); any failure of the cache falls back to ``define`` itself. One object per (path, prefix) in
    a process, as transformers' own lru_cache gives."""
    made: dict = {}

    def define_import_structure(module_path, prefix=None):
        key = (str(module_path), prefix)
        if key in made:
            return made[key]
        try:
            path = structure_cache_file(module_path, prefix)
        except OSError:
            path = None
        structure = None
        if path is not None:
            with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
                structure = marshal.loads(path.read_bytes())
        if not isinstance(structure, dict):         # none, or a file that holds something else
            structure = None
        if structure is None:
            structure = define(module_path, prefix)
            if path is not None:
                with contextlib.suppress(OSError, ValueError):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    temporary = path.with_name(f".{path.name}.{os.getpid()}")
                    temporary.write_bytes(marshal.dumps(structure))
                    os.replace(temporary, path)
        made[key] = structure
        return structure

    define_import_structure.__wrapped__ = define
    return define_import_structure


class _CacheImportStructure(importlib.abc.MetaPathFinder):
    """Loads ``transformers.utils.import_utils`` as the path finder would, then gives it
    :func:`cached_structures` around its ``define_import_structure`` (before any caller imports the name)."""

    def find_spec(self, name, path=None, target=None):
        if name != IMPORT_UTILS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            if callable(getattr(module, "define_import_structure", None)):
                module.define_import_structure = cached_structures(module.define_import_structure)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Put the finders first on ``sys.meta_path`` (no-ops when they are there or the modules are loaded)."""
    if not (all(name in sys.modules for name in DEFERRED) or any(isinstance(f, _DeferSklearn) for f in sys.meta_path)):
        sys.meta_path.insert(0, _DeferSklearn())
    if VLLM_GENERATION not in sys.modules and not any(isinstance(f, _DeferVLLMGeneration) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferVLLMGeneration())
    if IMPORT_UTILS not in sys.modules and not any(isinstance(f, _CacheImportStructure) for f in sys.meta_path):
        sys.meta_path.insert(0, _CacheImportStructure())
