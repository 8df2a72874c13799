"""Pretraining: SmolLM3-architecture models trained from scratch on a DeepSpeed engine."""
