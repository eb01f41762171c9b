"""The next release's toolset: `create_ticket` renamed `open_ticket`, nothing else
changed (a change an open run parked on `create_ticket` cannot replay)."""

from __future__ import annotations

import dataclasses

from boundloop import Toolset
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools

tools = Toolset[DemoDeps]()
tools.include(demo_tools, exclude=["create_ticket"])
tools.add(dataclasses.replace(demo_tools.get("create_ticket"), name="open_ticket"))
