"""The benchmark harness: ``distilserve bench`` (the docs' guide: reproduce the papers' table)."""
