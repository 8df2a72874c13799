"""The pretrain stage, declared (its tools ``plan``, ``burnin`` and ``doctor`` are in :mod:`smolforge.ops.commands`).

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> sorted(cli.tools), cli.stages["pretrain"].spec.example.split()[:2]
    ([], ['smolforge', 'pretrain'])
"""
from __future__ import annotations

from smolforge.commands import Commands, StageSpec


def register(cli: Commands) -> None:
    cli.stage(StageSpec("pretrain", "smolforge.pretrain.stage", makes_model=True, trains=True, seed_key="train.seed",
                        example="smolforge pretrain --config recipes/demo/pretrain.yaml --set name=pretrain-mine",
                        lr_find="smolforge.ops.lr_find.pretrain"))
