"""PPO: the stage and the pieces of its own training loop (TRL has no ``PPOTrainer`` any more).

- :mod:`.stage`: the recipe, ``validate``, ``run`` and the loop over steps (the registry's ``ppo``);
- :mod:`.spec`: :class:`PPOSpec`, the recipe's ``ppo:`` settings, imported by all the others;
- :mod:`.step`: one iteration (sample, score, advantages, update, metrics);
- :mod:`.models`: policy, value model, reference and their optimizer (imports torch);
- :mod:`.scoring`: one score per completion, from the reward functions and the end token;
- :mod:`.math`: the arithmetic (masks, whitening, KL, GAE, losses) in plain torch.

``PPOSpec`` is importable from here, as recipes and docs name it (``alignment.ppo.PPOSpec``).
"""
from .spec import PPOSpec

__all__ = ["PPOSpec"]
