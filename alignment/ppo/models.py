"""PPO's networks: the policy, the value model beside it, the frozen reference, and their optimizer.

Imports torch at the top (it defines ``nn.Module`` classes): :mod:`smolforge.alignment.ppo.stage`
imports it inside its functions only, so ``import smolforge.alignment.ppo.stage`` (the CLI, ``--help``)
stays cheap.

- :class:`ValueModel`: the parent's transformer body (``AutoModel``, no LM head) plus a
  zero-initialised ``nn.Linear(hidden, 1)`` on every position's last hidden state.
- :class:`PolicyAndValue`: policy and value model as one module, so accelerate/DeepSpeed prepare
  a single model with one optimizer (two parameter groups, two learning rates).
- :class:`Models` and :func:`build_models`: what the PPO loop holds, built from a parent's ``model/``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from smolforge.generation.prompts import load_tokenizer

from ..common import load_frozen, load_trainable
from .spec import PPOSpec

__all__ = ["ValueModel", "PolicyAndValue", "Models", "build_models", "gathered_policy"]


class ValueModel(nn.Module):
    """The parent's transformer body and a scalar head: one value per position."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        # the backbone's dtype: bf16 when ZeRO-3 loaded it sharded (zero.Init casts), which DeepSpeed
        # needs of every parameter it partitions; fp32 otherwise
        dtype = next(backbone.parameters()).dtype
        self.head = nn.Linear(backbone.config.hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids):
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


class PolicyAndValue(nn.Module):
    """Policy and value model as one module: one ``accelerator.prepare``, one optimizer."""

    def __init__(self, policy: nn.Module, value_model: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model

    @property
    def config(self):  # accelerate fills DeepSpeed's "auto" bucket sizes from config.hidden_size
        return self.policy.config

    @property
    def is_gradient_checkpointing(self) -> bool:  # read by TRL's unwrap_model_for_generation
        return bool(getattr(self.policy, "is_gradient_checkpointing", False))

    def gradient_checkpointing_disable(self) -> None:
        self.policy.gradient_checkpointing_disable()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
        self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def forward(self, input_ids, attention_mask, position_ids, response_length: int):
        """(logits predicting each response token, value of the state before it), ``[B, R(, V)]``."""
        logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             logits_to_keep=response_length + 1, use_cache=False).logits[:, :-1]
        values = self.value_model(input_ids, attention_mask, position_ids)
        return logits, values[:, -(response_length + 1):-1]


@dataclass
class Models:
    """What the loop holds: the prepared policy+value module, the frozen reference, the optimizer."""

    accelerator: Any
    model: Any                        # PolicyAndValue, as accelerate prepared it
    ref: Any                          # frozen copy of the parent
    optimizer: Any
    tokenizer: Any

    @property
    def policy(self):
        return self.accelerator.unwrap_model(self.model).policy


def no_dropout(model: nn.Module) -> None:
    """Dropout off (p = 0) everywhere in ``model``: rollout and update log-probs must agree."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def zero3(accelerator) -> bool:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def bf16(accelerator) -> bool:
    """Whether this accelerator trains in bf16: DeepSpeed's ``bf16.enabled``, else accelerate's mixed precision."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        return str(plugin.deepspeed_config.get("bf16", {}).get("enabled", False)).lower() == "true"
    return accelerator.mixed_precision == "bf16"


def build_models(model_dir, spec: PPOSpec, accelerator=None) -> Models:
    """Policy, value model and reference from a parent's ``model/``, prepared by accelerate.

    ``spec`` gives the learning rates and ``gradient_checkpointing``. The trained models load in
    fp32 (their master weights; DeepSpeed's bf16 keeps its own fp32 copy), the frozen reference in
    bf16 when training is bf16. Under ZeRO-3 (``zero3_init_flag``) each loads already sharded.
    """
    from accelerate import Accelerator
    from transformers import AutoModel

    accelerator = accelerator or Accelerator()
    tokenizer = load_tokenizer(model_dir)
    policy = load_trainable(model_dir)
    value_model = ValueModel(load_trainable(model_dir, auto_class=AutoModel))
    ref = load_frozen(model_dir, bf16=bf16(accelerator))
    for module in (policy, value_model, ref):
        no_dropout(module)
    if spec.gradient_checkpointing:  # training forwards already pass use_cache=False
        for backbone in (policy, value_model.backbone):
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = PolicyAndValue(policy, value_model)
    value_lr = spec.value_learning_rate if spec.value_learning_rate is not None else 10 * spec.learning_rate
    optimizer = torch.optim.AdamW([{"params": list(policy.parameters()), "lr": spec.learning_rate},
                                   {"params": list(value_model.parameters()), "lr": value_lr}],
                                  eps=1e-5, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        from trl.models.utils import prepare_deepspeed

        ref = prepare_deepspeed(ref, accelerator)
    else:
        ref = ref.to(accelerator.device)
    return Models(accelerator, model, ref, optimizer, tokenizer)


@contextlib.contextmanager
def gathered_policy(models: Models):
    """The policy's full parameters on every process (ZeRO-3 shards them), for saving."""
    if zero3(models.accelerator):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(models.policy.parameters()), modifier_rank=None):
            yield
    else:
        yield
