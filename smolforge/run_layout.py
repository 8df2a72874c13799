"""Where things live inside a run folder: the layout, declared once.

:data:`LAYOUT` names every entry a stage may write, by the accessor that finds it; :class:`RunLayout`
turns each row into an attribute (``run.tokenizer_dir`` is ``<run>/tokenizer``). Stages build paths
only through these accessors (``tests/test_run_layout.py`` fails on a hand-written one), and
``docs/run-folder.md``'s table is rendered from the same rows.

    >>> folder = RunLayout("runs/sft-demo")
    >>> folder.model_dir, folder.rollouts_dir, folder.data_shard_dir("sft")
    (PosixPath('runs/sft-demo/model'), PosixPath('runs/sft-demo/rl/rollouts'), PosixPath('runs/sft-demo/data/sft'))
    >>> is_run("runs/no-such-run")
    False

Regenerate the docs table after changing :data:`LAYOUT`::

    python -m smolforge.run_layout docs/run-folder.md
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import overload

__all__ = ["Entry", "LAYOUT", "RunLayout", "is_run", "render_layout", "with_layout", "BEGIN", "END"]


@dataclass(frozen=True)
class Entry:
    path: str     # relative to the run folder; a folder ends with "/"
    holds: str    # what it holds
    writer: str   # which stage (or part of the spine) writes it


LAYOUT: dict[str, Entry] = {
    "json_path": Entry("run.json", "stage, resolved recipe, parents, data fingerprints, versions, git commit, "
                       "start/end, status, metrics, error", "every stage (`Runs.start`)"),
    "model_dir": Entry("model/", "a Hugging Face model folder (safetensors, config, tokenizer with chat template)",
                       "import, pretrain, sft, dpo, orpo, reward, grpo, rloo, ppo, merge"),
    "metrics_path": Entry("metrics.jsonl", "one JSON object per logged step", "training stages"),
    "checkpoints_dir": Entry("checkpoints/", "resumable state: `step-N/` (pretrain) or `checkpoint-N/` (TRL)",
                             "training stages"),
    "eval_dir": Entry("eval/", "scores per suite (`<suite>.json`, `<suite>-samples.jsonl`), red-team results, "
                      "checkpoint audits (`audit/`)", "eval, redteam, audit"),
    "eval_watch_dir": Entry("eval/while_training/", "checkpoints scored during training (`eval_while_training:`): "
                            "`step-N/`, a run-shaped folder each (run.json with the scores, `eval/`; `model/` hard "
                            "links while it is scored), its log `step-N.log`, and `worker.log`", "training stages"),
    "report_path": Entry("report.html", "the human-readable report (self-contained)", "eval"),
    "gates_path": Entry("gates.json", "the promotion gates' verdicts on this run", "pipeline"),
    "seeds_path": Entry("seeds.json", "a seeds run's seeds, seed runs and mean, sd, n and values of every numeric "
                        "metric over them (its other entries link to the first seed's)", "`--seeds`, pipeline `seeds:`"),
    "data_dir": Entry("data/", "processed rows: `data/<kind>/part-*.jsonl` shards", "data, annotate (`data/prefs/`), "
                      "synth (`data/sft/`, `data/prefs/`)"),
    "data_card_path": Entry("data_card.json", "the data card: counts, tokens, domains, mixture, fingerprints", "data"),
    "data_card_md_path": Entry("data_card.md", "the data card, readable", "data"),
    "reports_dir": Entry("reports/", "bad rows, removed rows and decontamination hits", "data"),
    "tokenizer_dir": Entry("tokenizer/", "the tokenizer the data was made for", "data"),
    "packed_dir": Entry("packed/", "token ids packed per domain (memory-mapped by pretrain)", "data"),
    "datatrove_dir": Entry("datatrove/", "datatrove's work files (`work/`) and, by default, its logs", "data"),
    "adapter_dir": Entry("adapter/", "the LoRA adapter before it is merged into `model/`", "sft, dpo, orpo, reward"),
    "trainer_dir": Entry("trainer/", "the Trainer's output folder during a sweep (removed after it)", "lr-find"),
    "rl_dir": Entry("rl/", "what online RL keeps besides the model", "ppo, grpo, rloo"),
    "heldout_path": Entry("rl/heldout.jsonl", "held-out prompts answered before and after training",
                          "ppo, grpo, rloo"),
    "rollouts_dir": Entry("rl/rollouts/", "the policy's weights synced to the rollout server (`weights-N/`), its log",
                          "ppo, grpo (vllm-server)"),
    "lr_find_plot_path": Entry("lr_find.svg", "the LR range test's plot", "lr-find"),
    "lr_find_result_path": Entry("lr_find.json", "the LR range test's result (what `--json` prints)", "lr-find"),
    "serve_dir": Entry("serve/", "what `smolforge serve` keeps", "serve"),
    "serve_log_path": Entry("serve/vllm.log", "the vLLM server's log", "serve, judge (a `judge.run` served)"),
    "verdicts_path": Entry("verdicts.jsonl", "one judged item per line: both readings, the verdict and margin "
                           "(pairwise) or the score and reason (pointwise)", "judge"),
    "sanity_path": Entry("sanity.jsonl", "the judge's sanity suite (pairs with a known better answer), judged",
                         "judge"),
    "candidates_path": Entry("candidates.jsonl", "per prompt: every generated answer, its generator, grade and "
                             "the judge's reason", "synth"),
    "annotations_path": Entry("annotations.json", "the pulled verdicts: counts and agreement", "annotate"),
    "plots_dir": Entry("plots/", "one `<task>.svg` per task", "ablate"),
    "table_path": Entry("table.txt", "the ablation's table", "ablate"),
    "ablation_path": Entry("ablation.json", "the ablation's result", "ablate"),
    "mergekit_path": Entry("mergekit.yaml", "the mergekit configuration the merge ran", "merge"),
    "slurm_dir": Entry("slurm/", "the Slurm job's output (`job-<id>.out`) and stop files", "launch"),
    "slurm_job_path": Entry("slurm/job.sh", "the batch script (resubmit with `sbatch`)", "launch"),
    "slurm_recipe_path": Entry("slurm/recipe.yaml", "the recipe the job runs", "launch"),
    "slurm_launch_path": Entry("slurm/launch.json", "a launched pipeline's job id (in `<runs>/.launch/<pipeline>/`)",
                               "launch pipeline"),
    "tensorboard_dir": Entry("tensorboard/", "TensorBoard event files", "training stages (`tracking:`)"),
    "wandb_dir": Entry("wandb/", "an offline wandb run", "training stages (`tracking:`)"),
    "profile_dir": Entry("profile/", "torch profiler traces and summaries", "training stages (`profile:`)"),
}


class _At:
    """A :data:`LAYOUT` row as an attribute of :class:`RunLayout`: the entry's path in that folder."""

    def __set_name__(self, owner: type, name: str) -> None:
        entry = LAYOUT[name]   # an accessor without a row fails at import
        self.relative, self.__doc__ = entry.path.rstrip("/"), entry.holds

    @overload
    def __get__(self, layout: None, owner: type | None = None) -> _At: ...
    @overload
    def __get__(self, layout: RunLayout, owner: type | None = None) -> Path: ...

    def __get__(self, layout: RunLayout | None, owner: type | None = None) -> _At | Path:
        return self if layout is None else layout.path / self.relative


class RunLayout:
    """The paths inside a run folder (or a folder laid out like one, e.g. a launched pipeline's);
    reads nothing. :class:`smolforge.runs.Run` is one, with its run.json."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    json_path = _At()
    model_dir = _At()
    metrics_path = _At()
    checkpoints_dir = _At()
    eval_dir = _At()
    eval_watch_dir = _At()
    report_path = _At()
    gates_path = _At()
    seeds_path = _At()
    data_dir = _At()
    data_card_path = _At()
    data_card_md_path = _At()
    reports_dir = _At()
    tokenizer_dir = _At()
    packed_dir = _At()
    datatrove_dir = _At()
    adapter_dir = _At()
    trainer_dir = _At()
    rl_dir = _At()
    heldout_path = _At()
    rollouts_dir = _At()
    lr_find_plot_path = _At()
    lr_find_result_path = _At()
    serve_dir = _At()
    serve_log_path = _At()
    verdicts_path = _At()
    sanity_path = _At()
    candidates_path = _At()
    annotations_path = _At()
    plots_dir = _At()
    table_path = _At()
    ablation_path = _At()
    mergekit_path = _At()
    slurm_dir = _At()
    slurm_job_path = _At()
    slurm_recipe_path = _At()
    slurm_launch_path = _At()
    tensorboard_dir = _At()
    wandb_dir = _At()
    profile_dir = _At()

    def data_shard_dir(self, kind: str) -> Path:
        """``data/<kind>/``: the shards of one kind of rows (pretrain, sft, prefs, prompts, feedback)."""
        return self.data_dir / kind

    def plot_path(self, task: str) -> Path:
        """``plots/<task>.svg``."""
        return self.plots_dir / f"{task}.svg"

    @property
    def model_staging_dir(self) -> Path:
        """Where this process assembles a new ``model/`` before swapping it in."""
        return self.path / f".{self.model_dir.name}.tmp-{os.getpid()}"


def is_run(folder: str | Path) -> bool:
    """Whether ``folder`` holds a run (its run.json).

    >>> import tempfile
    >>> is_run(tempfile.mkdtemp())
    False
    """
    return RunLayout(folder).json_path.is_file()


BEGIN, END = "<!-- layout:begin -->", "<!-- layout:end -->"


def render_layout() -> str:
    """:data:`LAYOUT` as a markdown table (the one in docs/run-folder.md).

    >>> print(render_layout().splitlines()[0])
    | path | accessor | what it holds | written by |
    >>> print(next(line for line in render_layout().splitlines() if "`table.txt`" in line))
    | `table.txt` | `table_path` | the ablation's table | ablate |
    """
    rows = ["| path | accessor | what it holds | written by |", "| --- | --- | --- | --- |"]
    rows += [f"| `{entry.path}` | `{name}` | {entry.holds} | {entry.writer} |" for name, entry in LAYOUT.items()]
    return "\n".join(rows) + "\n"


def with_layout(text: str) -> str:
    """``text`` with what stands between its :data:`BEGIN` and :data:`END` markers rendered anew.

    >>> with_layout(f"# Run folder\\n{BEGIN}\\nold\\n{END}\\n").count("| `model/` |")
    1
    """
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise ValueError(f"no {BEGIN} ... {END} markers to put the layout table between")
    return f"{head}{BEGIN}\n{render_layout()}{END}{tail}"


def main(argv: list[str]) -> int:
    """``python -m smolforge.run_layout [FILE]``: rewrite FILE's table, or print the table."""
    if not argv:
        sys.stdout.write(render_layout())
        return 0
    path = Path(argv[0])
    path.write_text(with_layout(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
