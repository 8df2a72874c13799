"""Group Relative Policy Optimization of a run's model with TRL's GRPOTrainer.

    smolforge grpo --config recipes/demo/grpo.yaml
    smolforge grpo --config recipes/demo/grpo.yaml --set trainer.max_steps=20 --set rewards=[arith_verifier]

Reads a parent run (an SFT model) and RL prompts (a data run's ``prompts`` kind: ``{"prompt",
"answer"}`` rows), samples ``trainer.num_generations`` completions per prompt, scores them with
the recipe's reward functions and updates the policy on advantages normalised within each group.
Reports the held-out mean reward before and after (:mod:`smolforge.alignment.online`); ``model/`` is a
plain HF model. ``trainer:`` takes any ``trl.GRPOConfig`` field (``beta`` for a KL term,
``loss_type``, ``scale_rewards``…).

The loss family (:mod:`smolforge.alignment.grpo_math` has the formulas TRL's are tested against):
``trainer.loss_type`` grpo | bnpo | dr_grpo | dapo (TRL's default) | cispo (and TRL's sapo, luspo,
vespo); GSPO is ``trainer.importance_sampling_level: sequence``. Every name is checked before a run
exists, and the choice lands in run.json (``rl/loss_type``, ``rl/importance_sampling_level``):

    smolforge grpo --config recipes/demo/grpo.yaml --set trainer.loss_type=dr_grpo --set trainer.scale_rewards=none
    smolforge grpo --config recipes/demo/grpo.yaml --set trainer.loss_type=cispo --set trainer.epsilon_high=5.0
    smolforge grpo --config recipes/demo/grpo.yaml --set trainer.importance_sampling_level=sequence   # GSPO
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field

from trl import GRPOConfig

from smolforge.errors import RecipeError
from smolforge.runs import Run, Runs

from smolforge.generation.prompts import load_tokenizer

from .online import OnlineRecipe, online_defaults, train_online, validate_online


def defaults() -> dict:
    """Recipe values beneath the YAML (see :func:`smolforge.alignment.online.online_defaults`)."""
    return online_defaults()


@dataclass
class Recipe(OnlineRecipe):
    name: str = "grpo-demo"           # run name
    trainer: GRPOConfig = field(default_factory=lambda: GRPOConfig(**defaults()["trainer"]))  # any trl.GRPOConfig field
    tools: list = field(default_factory=list)  # tools the policy may call: calculator, python (sandboxed;
                                      #   smolforge.generation.tools); trainer.max_tool_calling_iterations caps the turns
    environment: str | None = None    # a stateful tool environment (TRL's environment_factory): sums (the embedded
                                      #   tool task: a calculator and a reward for getting the row's answer out of it;
                                      #   smolforge.generation.environments); its reward is added to rewards:


def grpo_loss_types() -> list[str]:
    """The loss names TRL's GRPOTrainer accepts (from GRPOConfig's help text).

    >>> {"grpo", "dr_grpo", "dapo", "bnpo", "cispo"} <= set(grpo_loss_types())
    True
    """
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    listed = help_text.split("Supported values are", 1)[-1].split(".", 1)[0]
    return re.findall(r"'(\w+)'", listed) or ["grpo", "dr_grpo", "dapo", "bnpo", "cispo"]


def check_loss(trainer: GRPOConfig) -> None:
    """``trainer.loss_type`` and ``importance_sampling_level`` name what TRL has, with the settings the
    loss needs (TRL would fail on an unknown name only at the first optimizer step).

    >>> from types import SimpleNamespace
    >>> settings = dict(importance_sampling_level="token", epsilon=0.2, epsilon_high=None)
    >>> check_loss(SimpleNamespace(loss_type="dr_gpro", **settings))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: trainer.loss_type: unknown GRPO loss 'dr_gpro' (did you mean 'dr_grpo'?)
    >>> check_loss(SimpleNamespace(loss_type="cispo", **settings))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: trainer.loss_type cispo: trainer.epsilon_high is CISPO's cap on the importance weight (ε_max, the ScaleRL paper's 5.0), got 0.2, which would scale every token's update down; set e.g. --set trainer.epsilon_high=5.0
    """
    known = grpo_loss_types()
    if trainer.loss_type not in known:
        close = difflib.get_close_matches(str(trainer.loss_type), known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known)}"
        raise RecipeError(f"trainer.loss_type: unknown GRPO loss '{trainer.loss_type}' ({hint})")
    if trainer.importance_sampling_level not in ("token", "sequence"):
        raise RecipeError(f"trainer.importance_sampling_level must be token or sequence (GSPO), "
                          f"got {trainer.importance_sampling_level!r}")
    if trainer.loss_type == "luspo" and trainer.importance_sampling_level != "sequence":
        raise RecipeError("trainer.loss_type luspo is sequence-level: set trainer.importance_sampling_level=sequence")
    high = trainer.epsilon_high if trainer.epsilon_high is not None else trainer.epsilon   # TRL's fallback
    if trainer.loss_type == "cispo" and high < 1.0:
        raise RecipeError(f"trainer.loss_type cispo: trainer.epsilon_high is CISPO's cap on the importance weight "
                          f"(ε_max, the ScaleRL paper's 5.0), got {high}, which would scale every "
                          f"token's update down; set e.g. --set trainer.epsilon_high=5.0")


def check_tools(recipe: Recipe, runs: Runs) -> None:
    """The recipe's tools (and environment) exist, the prompts are conversations, and the parent's chat
    template renders tools and has a tool-call format TRL can parse (the demo template's own
    ``response_template``; SmolLM3's XML tools, Hermes/Qwen JSON, Llama …:
    ``trl.chat_template_utils.add_response_schema``)."""
    from smolforge.generation.environments import resolve_environment

    resolve_environment(recipe.environment)
    if not recipe.tools and not recipe.environment:
        return
    import copy

    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from smolforge.generation.tool_loop import parses_calls
    from smolforge.generation.tools import resolve_tools

    from .common import model_parent

    resolve_tools(recipe.tools)
    tokenizer = load_tokenizer(model_parent(runs, recipe.parent).model_dir)
    if not supports_tool_calling(tokenizer):
        raise RecipeError(f"tools: the parent '{recipe.parent}' has a chat template that does not render tool "
                          "calls and tool answers; use a model with a tool-calling template or drop tools:")
    if not parses_calls(tokenizer):
        try:
            add_response_schema(copy.deepcopy(tokenizer))
        except Exception as err:  # noqa: BLE001 - TRL's own words on why it cannot parse tool calls here
            raise RecipeError(f"tools: the parent '{recipe.parent}' has a chat template whose tool calls TRL cannot "
                              f"parse ({str(err).splitlines()[0][:200]}); use a model with a known tool format "
                              "(SmolLM3, Qwen, Llama) or drop tools:") from None


def validate(recipe: Recipe, runs: Runs) -> None:
    check_loss(recipe.trainer)
    check_tools(recipe, runs)
    validate_online(recipe, runs, has_rollout_hook=True)


def trainer_factory(recipe: Recipe):
    """``make_trainer(model, dataset, tokenizer, rewards, callbacks, rollout_func)`` for
    :func:`~smolforge.alignment.online.train_online`: TRL's GRPOTrainer on the loaded policy."""
    from trl import GRPOTrainer

    def make_trainer(model, dataset, tokenizer, rewards, callbacks, rollout_func):
        if rollout_func is not None:  # TRL warns on every use of its experimental hook; said once in our log
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from smolforge.generation.environments import resolve_environment
        from smolforge.generation.tools import resolve_tools

        environment = resolve_environment(recipe.environment)
        if environment is not None:  # TRL warns that environment_factory is experimental; said here once
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        # a copy: TRL appends an environment's get_reward to the list it is given, and the held-out reward
        # after training reads the recipe's own rewards from ours
        return GRPOTrainer(model=model, reward_funcs=list(rewards), args=recipe.trainer, train_dataset=dataset,
                           processing_class=tokenizer, callbacks=callbacks, rollout_func=rollout_func,
                           tools=resolve_tools(recipe.tools) or None, environment_factory=environment)

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    return train_online("grpo", recipe, runs, trainer_factory(recipe), overwrite=overwrite, has_rollout_hook=True)
