"""The alignment stages' commands (sft, dpo, orpo, reward, grpo, rloo, ppo, merge): examples for their help.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.stages["dpo"].example
    'smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2'
    >>> cli.is_summary_metric("rl/heldout_reward_after"), cli.is_summary_metric("rl/weight_syncs")
    (True, False)
"""
from __future__ import annotations

from smolforge.commands import Commands

EXAMPLES = {
    "sft": "smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
    "dpo": "smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2",
    "orpo": "smolforge orpo --config recipes/demo/orpo.yaml --set trainer.beta=0.1",
    "reward": "smolforge reward --config recipes/demo/reward.yaml",
    "grpo": "smolforge grpo --config recipes/demo/grpo.yaml --set trainer.max_steps=20",
    "rloo": "smolforge rloo --config recipes/demo/rloo.yaml --set rewards=[arith_verifier]",
    "ppo": "smolforge ppo --config recipes/demo/ppo.yaml --set ppo.steps=10",
    "merge": "smolforge merge --config recipes/demo/merge.yaml --set method=slerp --set t=0.3",
}


# stages `smolforge lr-find` sweeps (smolforge.lr_range), and the module that does it
LR_FIND = {"sft": "smolforge.alignment.lr_find"}


def register(cli: Commands) -> None:
    for stage, example in EXAMPLES.items():
        cli.stage(stage, example=example, lr_find=LR_FIND.get(stage))
    # training summaries stay in run.json; RL's held-out reward is a score
    cli.summary(hide=["train/*", "sft/*", "reward/*", "ppo/*", "rl/heldout_prompts", "rl/train_prompts",
                      "rl/generation", "rl/weight_syncs", "merge/*"])
