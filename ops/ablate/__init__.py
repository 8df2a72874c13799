"""``smolforge ablate``: a baseline recipe, variants that each change one thing, several seeds each,
run through the pipeline runner, scored, and compared against the seed noise.

    smolforge ablate --config recipes/demo/ablate-lr.yaml
    smolforge ablate --config recipes/demo/ablate-anneal.yaml --set seeds=[0,1]
    smolforge ablate --config recipes/demo/ablate-lr.yaml --write-pipeline lr.pipeline.yaml  # for launch
    smolforge ablate --config recipes/demo/ablate-lr.yaml --analyze   # score runs that already exist

An ablation file::

    ablation: lr                       # the name: runs lr-baseline-s0 …, the result run ablate-lr
    recipe: pretrain.yaml              # the baseline stage recipe (relative to this file)
    set: {train.max_steps: 150}        # changes every run of the ablation (baseline and variants)
    seeds: [0, 1, 2]                   # every variant and the baseline run once per seed
    seed_key: train.seed               # where the seed goes (default: train.seed for pretrain,
                                       #   trainer.seed for the TRL stages)
    variants:                          # each changes ONE key; each value is a variant
      - {key: train.learning_rate, values: [1.0e-3]}
      - key: mixture                   # a value that is not a number or word needs a name
        values: {math-heavy: [{until: 1.0, weights: {facts: 0.4, math: 0.6}}]}
    mode: scratch                      # scratch | anneal
    from: pretrain-demo                # anneal: the main run whose model every run continues
    from_step: 300                     # anneal, optional: its DeepSpeed checkpoint at this step instead
    suite: embedded                    # the eval suite; tasks: a subset of it; limit: examples per task
    tasks: [facts, arith]
    limit: null
    launch: {processes: 2, launcher: torchrun}   # optional: how each run starts (the pipeline's launch:)

**Modes.** ``scratch`` trains every run from the recipe's initialisation. ``anneal`` continues the
model of a main run (``from:``, a pretraining run) for the recipe's fixed budget of steps with each
variant's change, typically a new data mixture with the LR decayed to zero (the playbook's
annealing runs); it sets the pretraining recipe's ``init:``. With ``from_step: N`` the runs start
from the main run's checkpoint at step N instead of its final model (the playbook branches before
the main run's decay): the checkpoint is exported once as the run ``<from>-step<N>`` (stage
pretrain, parent: the main run) and every run continues that.

**Running.** The runs are steps of one generated pipeline (:mod:`smolforge.pipeline`, with
``share_process: true``: consecutive one-rank runs share a process and pay the imports once).
A run that is already done with the very recipe planned, and trained after its parents (data
run, main run) were made, is reused, so an interrupted ablation continues where it stopped; a done
run of that name with another recipe, or older than a parent, is an error unless ``--overwrite``.
``--write-pipeline FILE`` writes the pipeline instead of running it, for ``smolforge launch
pipeline --config FILE`` on Slurm; ``--analyze`` afterwards scores what ran.

**Scoring and the audit.** The baseline's seed runs are audited first
(:func:`~smolforge.evals.audit.audit`: every checkpoint scored, each task checked for monotonicity,
low noise across seeds, a margin above random and a consistent ranking), so the recipe must keep a
series of checkpoints (pretraining: ``checkpoint.every_steps`` and ``checkpoint.keep``). The final
model of every run is scored on the same tasks (scores cached per run, as the audit caches them);
:mod:`.stats` compares each variant with the baseline per task and gives a
verdict only beyond the seed noise; tasks that failed the audit are marked in the table.

The result is the run ``ablate-<name>`` (stage ``ablate``, parents: every run): ``ablation.json``,
``table.txt`` and one plot per task, ``plots/<task>.svg`` (each seed's score, the means, ± one
standard deviation).

The parts: :mod:`.ablation` (the file and the runs it plans), :mod:`.run` (training and scoring),
:mod:`.stats` (the verdicts), :mod:`.report` (table, plots, the result run), :mod:`.command`.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "p.yaml").write_text("stage: pretrain\\nname: p\\ntrain: {learning_rate: 3.0e-3}\\n")
    >>> _ = (folder / "a.yaml").write_text("ablation: lr\\nrecipe: p.yaml\\nseeds: [0, 1]\\n"
    ...     "variants: [{key: train.learning_rate, values: [1.0e-3]}]\\n")
    >>> ablation = load_ablation(folder / "a.yaml")
    >>> [(p.variant.label, p.name) for p in ablation.plan()]  # doctest: +NORMALIZE_WHITESPACE
    [('baseline', 'lr-baseline-s0'), ('baseline', 'lr-baseline-s1'),
     ('learning_rate=0.001', 'lr-learning_rate-0.001-s0'), ('learning_rate=0.001', 'lr-learning_rate-0.001-s1')]
    >>> ablation.plan()[3].recipe["train"]
    {'learning_rate': 0.001, 'seed': 1}
"""
from __future__ import annotations

from .ablation import ABLATION_KEYS, MODES, RESULT_STAGE, Ablation, PlannedRun, Variant, load_ablation
from .command import add_arguments, command
from .run import analyze, branch_point, pipeline_file, run_ablation

__all__ = ["Variant", "PlannedRun", "Ablation", "load_ablation", "run_ablation", "analyze", "command",
           "add_arguments", "ABLATION_KEYS", "MODES", "RESULT_STAGE", "branch_point", "pipeline_file"]
