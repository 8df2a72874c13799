"""``import smolforge`` defers transformers' scikit-learn and scipy.optimize imports to their first use
(smolforge/lean_imports.py).

That a process which loads transformers, TRL, accelerate and DeepSpeed and trains never imports
scikit-learn or scipy.optimize, and that TRL's online trainers import without vLLM until TRL builds its VLLMGeneration,
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


def test_the_object_detection_losses_match_with_scipy_s_own_assignment_through_a_deferred_stand_in():
    import transformers.utils
    from transformers.loss import loss_for_object_detection, loss_rt_detr

    from smolforge import lean_imports

    assert loss_rt_detr.linear_sum_assignment.__module__ == lean_imports.__name__
    assert transformers.utils.is_scipy_available() and loss_for_object_detection.is_scipy_available()
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    rows, cols = loss_for_object_detection.linear_sum_assignment(cost)
    assert rows.tolist() == [0, 1, 2] and cols.tolist() == [1, 0, 2]       # total cost 5, scipy's answer
