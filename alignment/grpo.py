"""Group Relative Policy Optimization of a run's model with TRL's GRPOTrainer.

    smolforge grpo --config recipes/demo/grpo.yaml
    smolforge grpo --config recipes/demo/grpo.yaml --set trainer.max_steps=20 --set rewards=[arith_verifier]

Reads a parent run (an SFT model) and RL prompts (a data run's ``prompts`` kind: ``{"prompt",
"answer"}`` rows), samples ``trainer.num_generations`` completions per prompt, scores them with
the recipe's reward functions and updates the policy on advantages normalised within each group.
Reports the held-out mean reward before and after (:mod:`smolforge.alignment.online`); ``model/`` is a
plain HF model. ``trainer:`` takes any ``trl.GRPOConfig`` field (``beta`` for a KL term,
``loss_type``, ``scale_rewards``…).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from trl import GRPOConfig

from smolforge.runs import Run, Runs

from .online import OnlineRecipe, online_defaults, train_online, validate_online


def defaults() -> dict:
    """Recipe values beneath the YAML (see :func:`smolforge.alignment.online.online_defaults`)."""
    return online_defaults()


@dataclass
class Recipe(OnlineRecipe):
    name: str = "grpo-demo"           # run name
    trainer: GRPOConfig = field(default_factory=lambda: GRPOConfig(**defaults()["trainer"]))  # any trl.GRPOConfig field


def validate(recipe: Recipe, runs: Runs) -> None:
    validate_online(recipe, runs, has_rollout_hook=True)


def trainer_factory(recipe: Recipe):
    """``make_trainer(model, dataset, tokenizer, rewards, callbacks, rollout_func)`` for
    :func:`~smolforge.alignment.online.train_online`: TRL's GRPOTrainer on the loaded policy."""
    from trl import GRPOTrainer

    def make_trainer(model, dataset, tokenizer, rewards, callbacks, rollout_func):
        if rollout_func is not None:  # TRL warns on every use of its experimental hook; said once in our log
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        return GRPOTrainer(model=model, reward_funcs=rewards, args=recipe.trainer, train_dataset=dataset,
                           processing_class=tokenizer, callbacks=callbacks, rollout_func=rollout_func)

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    return train_online("grpo", recipe, runs, trainer_factory(recipe), overwrite=overwrite, has_rollout_hook=True)
