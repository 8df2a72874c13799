"""``import smolforge`` defers transformers' scikit-learn import to its first use (smolforge/lean_imports.py)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

PROBE = """
import json, sys
import numpy as np
import smolforge
import transformers.utils, transformers.data.metrics as glue
from transformers.generation import candidate_generator
found = {"after_load": "sklearn" in sys.modules, "checks": [transformers.utils.is_sklearn_available(),
         candidate_generator.is_sklearn_available(), glue.is_sklearn_available()]}
fpr, tpr, thresholds = candidate_generator.roc_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
found.update(roc_tpr=[float(x) for x in tpr], glue=glue.glue_compute_metrics("mrpc", np.array([1, 0, 1]), np.array([1, 0, 0])),
             after_use="sklearn" in sys.modules)
print(json.dumps(found))
"""


def test_transformers_loads_without_sklearn_and_imports_it_on_first_use():
    # without `import smolforge` first, transformers imports sklearn.metrics while loading these modules
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after_load"] is False and found["checks"] == [True, True, True]
    assert found["roc_tpr"] == [0.0, 0.5, 0.5, 1.0, 1.0]                  # scikit-learn's own roc_curve
    assert found["glue"]["acc"] == 2 / 3 and found["glue"]["f1"] == 2 / 3      # and its f1_score
    assert found["after_use"] is True
