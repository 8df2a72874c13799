"""``import smolforge`` defers transformers' scikit-learn and scipy.optimize imports to their first use
(smolforge/lean_imports.py).

That a process which loads transformers, TRL, accelerate and DeepSpeed and trains never imports
scikit-learn or scipy.optimize, and that TRL's online trainers import without vLLM until TRL builds its VLLMGeneration,
is checked in the PPO ZeRO-3 step's own fresh process (test_ppo_stage.py); here, that the stand-ins
are scikit-learn's functions and transformers' checks still see it installed, and that transformers'
table of lazily loaded classes comes from its cache file, equal to the scan it replaces.
"""
from __future__ import annotations

import marshal
import os
from pathlib import Path

import numpy as np
import pytest


def test_transformers_metrics_are_sklearn_s_own_through_deferred_stand_ins():
    import transformers.data.metrics as glue
    import transformers.utils
    from transformers.generation import candidate_generator

    from smolforge import lean_imports

    assert candidate_generator.roc_curve.__module__ == lean_imports.__name__          # loaded after conftest's smolforge
    assert [transformers.utils.is_sklearn_available(), candidate_generator.is_sklearn_available(),
            glue.is_sklearn_available()] == [True, True, True]
    _, tpr, _ = candidate_generator.roc_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    assert [float(x) for x in tpr] == [0.0, 0.5, 0.5, 1.0, 1.0]
    scores = glue.glue_compute_metrics("mrpc", np.array([1, 0, 1]), np.array([1, 0, 0]))
    assert scores["acc"] == 2 / 3 and scores["f1"] == 2 / 3


def test_the_object_detection_losses_match_with_scipy_s_own_assignment_through_a_deferred_stand_in():
    import transformers.utils
    from transformers.loss import loss_for_object_detection, loss_rt_detr

    from smolforge import lean_imports

    assert loss_rt_detr.linear_sum_assignment.__module__ == lean_imports.__name__
    assert transformers.utils.is_scipy_available() and loss_for_object_detection.is_scipy_available()
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    rows, cols = loss_for_object_detection.linear_sum_assignment(cost)
    assert rows.tolist() == [0, 1, 2] and cols.tolist() == [1, 0, 2]       # total cost 5, scipy's answer


def test_transformers_import_structure_comes_from_its_cache_file_equal_to_the_scan(tmp_path, monkeypatch):
    import transformers
    import transformers.utils.import_utils as import_utils

    from smolforge import lean_imports

    scan = import_utils.define_import_structure.__wrapped__     # installed before transformers loaded (conftest)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    models = Path(transformers.__file__).parent / "models"
    written = lean_imports.cached_structures(scan)(models, "models")
    [cache_file] = (tmp_path / "smolforge" / "import-structure").iterdir()
    assert cache_file == lean_imports.structure_cache_file(models, "models")
    assert written == scan(models, "models") and "models.llama.modeling_llama" in written[frozenset({"torch"})]

    def no_scan(*args):
        raise AssertionError("scanned again instead of reading the cache file")

    read = lean_imports.cached_structures(no_scan)
    assert read(models, "models") == written and read(models, "models") is read(models, "models")
    for damaged in (b"not marshal", marshal.dumps(["a", "list"])):   # a damaged file: scanned again, rewritten
        cache_file.write_bytes(damaged)
        assert lean_imports.cached_structures(scan)(models, "models") == written
        assert lean_imports.cached_structures(no_scan)(models, "models") == written


def test_the_cache_file_is_named_after_the_files_that_decide_the_table(tmp_path):
    from smolforge.lean_imports import structure_cache_file

    package = tmp_path / "transformers"
    (package / "models" / "llama").mkdir(parents=True), (package / "utils").mkdir()
    for file in (package / "__init__.py", package / "utils" / "import_utils.py", package / "models" / "__init__.py"):
        file.write_text("")
    models = package / "models"
    first = structure_cache_file(models, "models")
    assert first == structure_cache_file(models / "__init__.py", "models") != structure_cache_file(models, None)
    (models / "qwen2").mkdir()                                   # a model added
    added = structure_cache_file(models, "models")
    (package / "__init__.py").write_text("__version__ = '9'")    # a reinstall
    assert len({first, added, structure_cache_file(models, "models")}) == 3
    assert structure_cache_file(models / "llama", None) is None  # the small per-model tables are not cached
    with pytest.raises(OSError):                                # the wrapper then scans, uncached
        structure_cache_file(tmp_path / "gone" / "transformers" / "models" / "__init__.py", None)
    assert os.listdir(tmp_path) == ["transformers"]              # naming a file writes nothing
