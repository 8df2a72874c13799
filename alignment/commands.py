"""The alignment stages, declared (sft, dpo, orpo, cpo, kto, reward, grpo, rloo, ppo, distill, merge), with examples for their help.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.stages["dpo"].spec.example
    'smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2'
    >>> cli.is_summary_metric("rl/heldout_reward_after"), cli.is_summary_metric("rl/weight_syncs")
    (True, False)
"""
from __future__ import annotations

from smolforge.commands import Commands, StageSpec

STAGES = (
    StageSpec("sft", "smolforge.alignment.sft", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
              lr_find="smolforge.ops.lr_find.sft"),
    StageSpec("dpo", "smolforge.alignment.dpo", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2"),
    StageSpec("orpo", "smolforge.alignment.orpo", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge orpo --config recipes/demo/orpo.yaml --set trainer.beta=0.1"),
    StageSpec("cpo", "smolforge.alignment.cpo", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge cpo --config recipes/demo/simpo.yaml --set trainer.simpo_gamma=1.5"),
    StageSpec("kto", "smolforge.alignment.kto", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge kto --config recipes/demo/kto.yaml --set trainer.undesirable_weight=1.5"),
    # its run holds a scorer, not a causal LM: nothing to evaluate after it
    StageSpec("reward", "smolforge.alignment.reward", seed_key="trainer.seed", trains=True,
              example="smolforge reward --config recipes/demo/reward.yaml"),
    StageSpec("grpo", "smolforge.alignment.grpo", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge grpo --config recipes/demo/grpo.yaml --set trainer.max_steps=20"),
    StageSpec("rloo", "smolforge.alignment.rloo", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge rloo --config recipes/demo/rloo.yaml --set rewards=[arith_verifier]"),
    StageSpec("ppo", "smolforge.alignment.ppo.stage", seed_key="ppo.seed", makes_model=True, trains=True,
              example="smolforge ppo --config recipes/demo/ppo.yaml --set ppo.steps=10"),
    StageSpec("distill", "smolforge.alignment.distill", seed_key="trainer.seed", makes_model=True, trains=True,
              example="smolforge distill --config recipes/demo/distill.yaml --set divergence=reverse_kl"),
    StageSpec("merge", "smolforge.alignment.merge", seed_key="seed", makes_model=True,
              example="smolforge merge --config recipes/demo/merge.yaml --set method=slerp --set t=0.3"),
)


def register(cli: Commands) -> None:
    for spec in STAGES:
        cli.stage(spec)
    # training summaries stay in run.json; RL's held-out reward is a score
    cli.summary(hide=["train/*", "sft/*", "reward/*", "ppo/*", "rl/heldout_prompts", "rl/train_prompts",
                      "rl/generation", "rl/weight_syncs", "merge/*", "distill/divergence", "distill/beta",
                      "distill/teacher", "distill/heldout_prompts", "distill/train_prompts"])
