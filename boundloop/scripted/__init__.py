"""A scripted, OpenAI-compatible model server for tests, the offline demo and bug reproduction.

Modules:

- :mod:`boundloop.scripted.script` -- the JSON script format (pydantic models, ``load_script``).
- :mod:`boundloop.scripted.server` -- ``ScriptedModelServer``, a real HTTP server on 127.0.0.1
  that replays the script verbatim and validates requests (``python -m
  boundloop.scripted.server SCRIPT.json`` serves one by hand).
- :mod:`boundloop.scripted.validation` -- pure request validators imitating the real APIs.
- :mod:`boundloop.scripted.builders` -- pure helpers that build raw response bodies.

The server module is deliberately not imported here, so that ``python -m
boundloop.scripted.server`` runs without a double-import warning.
"""
