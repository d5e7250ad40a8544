"""The benchmark harness: ``distilserve bench`` (see ../shared/BENCHMARKS.md)."""
