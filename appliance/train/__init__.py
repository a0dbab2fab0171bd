"""Fine-tuning: task adapters, the training loop, checkpoints and run tracking."""
