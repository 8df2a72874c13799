"""The learning-rate range test (Leslie Smith), ``smolforge lr-find``.

    smolforge lr-find --config recipes/demo/pretrain.yaml
    smolforge lr-find --config recipes/demo/sft.yaml --min 1e-6 --max 1 --steps 100 --json

One short run of the stage's own training setup whose learning rate is multiplied by a constant
factor every optimizer step, from ``--min`` to ``--max``, the loss recorded at each step. The sweep
stops early when the smoothed loss exceeds 4x its minimum so far, or a loss is not finite.

- :mod:`.arithmetic`: the planned LRs, the smoothed loss, the stop rule, the suggestion and its cross-check;
- :mod:`.plot`: the SVG; :mod:`.sweep`: :class:`Sweep`, one test as it runs and its run folder;
- :mod:`.command`: the command (stdlib and spine only: the parser stays cheap);
- :mod:`.pretrain`, :mod:`.sft`: the stages' sweeps, each on its stage's own training setup; a stage's
  ``StageSpec(lr_find=...)`` names its module. These two import their stage (torch, TRL); the rest
  imports no ML library, and is importable from here.

The stage module runs its setup under :meth:`Sweep.run` with the LR multiplier
:meth:`Sweep.multiplier`, reports every step through :meth:`Sweep.record` and ends with :meth:`Sweep.finish`.

    >>> [fmt_lr(lr) for lr in exponential_lrs(1e-3, 1.0, 4)]
    ['1e-3', '0.01', '0.1', '1']
"""
from __future__ import annotations

from .arithmetic import (DIVERGE_FACTOR, RULE, RULES, check_range, divergence, exponential_lrs, fmt_lr, half_window,
                         slopes, smooth, suggest)
from .command import add_arguments, command, summary
from .plot import svg_plot
from .sweep import STAGE, Sweep

__all__ = ["Sweep", "exponential_lrs", "check_range", "half_window", "smooth", "divergence", "slopes", "suggest",
           "svg_plot", "fmt_lr", "summary", "add_arguments", "command", "STAGE", "RULE", "RULES", "DIVERGE_FACTOR"]
