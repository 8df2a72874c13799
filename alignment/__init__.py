"""Alignment stages driven by TRL: one module per stage (``sft``, ``dpo``), shared helpers in ``common``."""
