"""``import smolforge`` defers transformers' scikit-learn import to its first use (smolforge/lean_imports.py).

That a process which loads transformers, TRL, accelerate and DeepSpeed and trains never imports
scikit-learn, and that TRL's online trainers import without vLLM until TRL builds its VLLMGeneration,
is checked in the PPO ZeRO-3 step's own fresh process (test_ppo_stage.py); here, that the stand-ins
are scikit-learn's functions and transformers' checks still see it installed.
"""
from __future__ import annotations

import numpy as np


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
