"""What the online-RL stages built on TRL (GRPO, RLOO) share: prompts, rewards, held-out scoring.

A stage reads a parent run's model and a data run's ``prompts`` kind (``{"prompt", "answer"}``
rows; or a ``.jsonl`` of such rows), holds out ``heldout_fraction`` of the prompts (a seeded
shuffle), resolves the recipe's ``rewards:`` (short names, ``module:function`` or ``run:<reward
run>``, see :mod:`alignment.rewards`) and trains with TRL. Before and after training the policy
answers the held-out prompts greedily; the mean verifier reward of both lands in run.json as
``rl/heldout_reward_before`` and ``rl/heldout_reward_after``, which is how a recipe shows RL helped.

Generation: TRL generates with HF ``generate`` on CPU; with a CUDA GPU and vLLM installed the
defaults switch to TRL's ``use_vllm`` colocate mode. The choice is logged once.

    >>> sorted(OnlineRecipe().__dataclass_fields__)[:3]
    ['data', 'eval_max_new_tokens', 'heldout_fraction']
"""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smolforge.errors import RecipeError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs

from .common import (cuda_available, lineage_fingerprints, load_tokenizer, model_parent, run_logger,
                     split_heldout, train_summary, trainer_defaults)

log = logging.getLogger(__name__)
_LOGGED: set[str] = set()


def generation_defaults() -> dict:
    """TRL's vLLM colocate mode where it can run (CUDA + vLLM installed), HF generate elsewhere."""
    use_vllm = cuda_available() and importlib.util.find_spec("vllm") is not None
    message = ("rollouts: vLLM (TRL colocate mode)" if use_vllm else
               "rollouts: HF generate (vLLM needs a CUDA GPU for in-process generation)")
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.info(message)
    return {"use_vllm": use_vllm, "vllm_mode": "colocate"}


@dataclass
class OnlineRecipe:
    """Fields every online-RL recipe has; a stage adds its ``trainer`` (a TRL config)."""

    name: str = "rl-demo"             # run name
    parent: str = "sft-demo"          # run whose model/ is the starting policy
    data: str = "data-demo"           # data run (its prompts) or a .jsonl of {"prompt", "answer"} rows
    rewards: list = field(default_factory=lambda: ["answer_match"])  # reward functions or run:<reward run>
    heldout_fraction: float = 0.2     # prompts kept out of training to measure the reward before/after
    eval_max_new_tokens: int = 32     # greedy answer length for the held-out measurement


def online_defaults(**overrides) -> dict:
    """Trainer values for a CPU demo: short completions, small groups, constant LR; vLLM where it runs."""
    values = dict(max_steps=60, per_device_train_batch_size=16, num_generations=8, max_completion_length=24,
                  learning_rate=5e-6, temperature=1.0, lr_scheduler_type="constant", logging_steps=5)
    values.update(generation_defaults())
    values.update(overrides)
    return {"trainer": trainer_defaults(**values)}


def load_prompts(recipe, runs: Runs):
    """(paths, data run or None, train rows, held-out rows) for the recipe's ``data``."""
    from data.schemas import load_many, resolve_data

    paths, data_run = resolve_data(recipe.data, runs, "prompts")
    rows = load_many(paths, "prompt")
    train, heldout = split_heldout(rows, recipe.heldout_fraction, recipe.trainer.seed)
    return paths, data_run, train, heldout


def reward_functions(names: list, runs: Runs) -> list[Callable]:
    """The recipe's rewards as checked callables (errors name the function)."""
    from .rewards import resolve

    if not names:
        raise RecipeError("rewards: name at least one reward function (e.g. [answer_match]) or run:<reward run>")
    return [resolve(name, runs) for name in names]


def validate_online(recipe, runs: Runs) -> None:
    """Parent model, prompt rows, reward names and the split, before any run folder exists."""
    model_parent(runs, recipe.parent)
    if not 0 < recipe.heldout_fraction < 1:
        raise RecipeError(f"heldout_fraction must be between 0 and 1, got {recipe.heldout_fraction}")
    _, _, train, heldout = load_prompts(recipe, runs)
    if len(train) < recipe.trainer.num_generations:
        raise RecipeError(f"only {len(train)} training prompts; need at least trainer.num_generations "
                          f"({recipe.trainer.num_generations})")
    reward_functions(recipe.rewards, runs)


def train_online(stage: str, recipe, runs: Runs, make_trainer: Callable[..., Any], *,
                 overwrite: bool = False) -> Run:
    """Parent model + prompts + rewards → TRL trainer → ``model/``, with held-out reward before/after.

    ``make_trainer(model, dataset, tokenizer, reward_fns, callbacks)`` builds the TRL trainer.
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from data.jsonl import write_jsonl

    from .rewards import mean_reward

    parent = model_parent(runs, recipe.parent)
    paths, data_run, train, heldout = load_prompts(recipe, runs)
    rewards = reward_functions(recipe.rewards, runs)
    parents = [parent] + ([data_run] if data_run else [])
    with runs.start(stage, recipe.name, to_dict(recipe), parents=parents,
                    data_fingerprints=lineage_fingerprints(parents, {"prompts": paths}), overwrite=overwrite) as run:
        recipe.trainer.output_dir = str(run.checkpoints_dir)
        tokenizer = load_tokenizer(parent.model_dir)
        model = AutoModelForCausalLM.from_pretrained(parent.model_dir)
        before, details_before = mean_reward(model, tokenizer, heldout, rewards,
                                             max_new_tokens=recipe.eval_max_new_tokens)
        log.info("%s: held-out reward of the parent policy %.3f on %d prompts", stage, before, len(heldout))
        trainer = make_trainer(model, Dataset.from_list(train), tokenizer, rewards, [run_logger(run)])
        result = trainer.train()
        after, details = mean_reward(trainer.model, tokenizer, heldout, rewards,
                                     max_new_tokens=recipe.eval_max_new_tokens)
        run.save_model(trainer.model, tokenizer)
        write_jsonl(run.path / "rl" / "heldout.jsonl",
                    [{"before": b, "after": a} for b, a in zip(details_before, details)])
        summary = train_summary(trainer, result)
        summary.update({"rl/heldout_reward_before": round(before, 5), "rl/heldout_reward_after": round(after, 5),
                        "rl/heldout_prompts": len(heldout), "rl/train_prompts": len(train)})
        run.finish(metrics=summary)
    return run
