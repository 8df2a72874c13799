"""Which eval tasks can judge an ablation: every public name of the audit, importable from here.

- :mod:`.evaluate`: :func:`audit` scores every checkpoint of a series of runs and assembles the result
  (what the audit measures and how checkpoints are found is described there);
- :mod:`.stats`: the statistics per task, the verdict, the result;
- :mod:`.checkpoints`: a run's scorable points, DeepSpeed state exported to HF;
- :mod:`.cache`: the scores cached per run, step, suite and limit;
- :mod:`.report`: the result as a text table and as JSON.
"""
from .checkpoints import Checkpoint, export_checkpoint, find_checkpoints
from .evaluate import audit
from .report import audit_json, format_audit, write_audit
from .stats import Thresholds, kendall_tau, spearman, summarize, task_statistics

__all__ = ["Thresholds", "Checkpoint", "spearman", "kendall_tau", "task_statistics", "summarize",
           "find_checkpoints", "export_checkpoint", "audit", "format_audit", "audit_json", "write_audit"]
