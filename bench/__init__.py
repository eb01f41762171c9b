"""Benchmarks of boundloop against bare Temporal on the same dev server (`make bench`)."""
