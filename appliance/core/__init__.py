"""What every layer may use: errors, settings, the clock, names and paths, logs, the host."""
