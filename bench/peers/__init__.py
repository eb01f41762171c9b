"""The peers' side of `make bench-peers`: Temporal's OpenAI Agents integration and
pydantic-ai's Temporal integration, run on the bench's dev server against the same
scripted model.

This package runs in `.venv-peers` (the peers' packages, no boundloop); `report` is
plain Python so both sides import it. The product side that drives it is `bench.side`.
"""
