"""Training: distillation, fine-tuning for the embedded default, and their data."""
