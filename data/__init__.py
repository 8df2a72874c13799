"""Data: the synthetic embedded default, JSONL schemas, tokenizer training and packing."""
