"""smolforge: post-training workbench for small LMs (the spine: CLI, recipes, runs, lineage).

Importing this package is cheap (stdlib + pyyaml); stages live in data/, pretrain/,
alignment/ and evals/ and are imported only when their command runs.

    >>> import smolforge
    >>> smolforge.__version__
    '0.1.0'
"""
__version__ = "0.1.0"

from smolforge.lean_imports import install as _install_lean_imports  # noqa: E402

_install_lean_imports()
