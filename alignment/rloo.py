"""REINFORCE Leave-One-Out (RLOO) on a run's model with TRL's RLOOTrainer.

    smolforge rloo --config recipes/demo/rloo.yaml
    smolforge rloo --config recipes/demo/rloo.yaml --set trainer.num_generations=4

Same inputs and outputs as :mod:`smolforge.alignment.grpo`; the advantage of each completion is its reward
minus the mean reward of the other completions of its prompt (the leave-one-out baseline), and
``trainer.beta`` (TRL default 0.05) keeps a KL penalty to the parent. ``trainer:`` takes any
``trl.RLOOConfig`` field.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trl import RLOOConfig

from smolforge.runs import Run, Runs

from .online import OnlineRecipe, online_defaults, train_online, validate_online


def defaults() -> dict:
    """Recipe values beneath the YAML (see :func:`smolforge.alignment.online.online_defaults`)."""
    return online_defaults()


@dataclass
class Recipe(OnlineRecipe):
    name: str = "rloo-demo"           # run name
    trainer: RLOOConfig = field(default_factory=lambda: RLOOConfig(**defaults()["trainer"]))  # any trl.RLOOConfig field


def validate(recipe: Recipe, runs: Runs) -> None:
    validate_online(recipe, runs)


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from trl import RLOOTrainer

    return train_online("rloo", recipe, runs, lambda model, dataset, tokenizer, rewards, callbacks, _: RLOOTrainer(
        model=model, reward_funcs=rewards, args=recipe.trainer, train_dataset=dataset,
        processing_class=tokenizer, callbacks=callbacks), overwrite=overwrite)
