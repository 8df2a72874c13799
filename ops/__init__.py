"""The playbook's working method across stages: plan, doctor, burn-in, LR finder, ablations.

Above every stage (it may import the spine, data, generation, pretrain, alignment, evals and
annotate); nothing imports it but the CLI, through :data:`smolforge.registry.COMMAND_MODULES`.
"""
