"""The benchmark harness: ``distilserve bench`` (the README's Benchmarks section)."""
