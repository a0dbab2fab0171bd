"""Datasets: where their rows come from (sources), how they are checked and stored (datasets)."""
