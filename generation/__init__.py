"""smolforge.generation: the one place where text is sampled (placeholder, filled below)."""
