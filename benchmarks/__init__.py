"""Performance scripts: `python -m benchmarks.<name>` from the checkout root."""
