"""``import smolforge`` defers transformers' scikit-learn import to its first use (smolforge/lean_imports.py).

That a process which loads transformers, TRL, accelerate and DeepSpeed and trains never imports
scikit-learn is checked in the PPO ZeRO-3 step's own process (test_ppo_stage.py); here, that the
stand-ins are scikit-learn's functions and transformers' checks still see it installed.
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


DEFERRED_VLLM = r'''
import importlib.util, inspect, sys
import smolforge                                    # installs the stand-in
from trl import GRPOTrainer, RLOOTrainer            # TRL's online trainers, which import vllm_generation
from trl.generation import vllm_generation
print("vllm at load:", "vllm" in sys.modules, "stand-in:", getattr(vllm_generation, "_smolforge_stand_in", False))
try:
    vllm_generation.VLLMGeneration()                # what GRPOTrainer does with use_vllm, here without arguments
except TypeError as error:
    print("built:", error)
real = sys.modules["trl.generation.vllm_generation"]
print("real:", not getattr(real, "_smolforge_stand_in", False), "vllm:", "vllm" in sys.modules,
      "client:", real.VLLMClient.__module__, "signature:", list(inspect.signature(real.VLLMGeneration).parameters)[:1])
'''


def test_trls_online_trainers_load_without_vllm_until_they_build_its_generation():
    """`from trl import GRPOTrainer` no longer imports vLLM (≈5 s of 13 on 2 cores); building TRL's
    VLLMGeneration (use_vllm) loads the real module, and vLLM with it."""
    import importlib.util
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", DEFERRED_VLLM], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "vllm at load: False stand-in: True"
    assert lines[1].startswith("built: VLLMGeneration.__init__() missing")     # the real class's own __init__
    has_vllm = importlib.util.find_spec("vllm") is not None
    assert lines[2] == (f"real: True vllm: {has_vllm} client: trl.generation.vllm_client signature: ['model']")
