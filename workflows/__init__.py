"""boundloop's workflows: the loop, the budget ledger, the session."""

#: Whether boundloop's workflows run in Temporal's sandbox: they do not (each is defined
#: with `sandboxed=False`; a worker's other workflows keep it). Their modules are passed
#: through it (worker/plugin.py), so it checked none of their code, while it cost every
#: workflow task: the SDK runs code in the sandbox for each payload it encodes or decodes
#: (its serialization context), and wraps `isinstance`/`issubclass` for every thread of
#: the process while an activation runs (docs/benchmarks.md, "Outside the sandbox").
SANDBOXED = False
