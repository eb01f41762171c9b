"""An agent: tools, model, API, instructions, limits, policy and task queue, defined once.

    agent = boundloop.Agent(tools, model="gpt-5-mini", instructions="...",
                            limits=boundloop.Limits(max_steps=8))
    async with boundloop.Worker(client, agent, deps=MyDeps(), model=AsyncOpenAI()):
        run = await agent.start(client, "question")
        session = await agent.session(client)

Everything is checked when the agent is made (pydantic: limits, policy, model and budget
together; the tools that limits and policy name), so a run or session it starts is never
refused for its settings. The agent is immutable: `agent.replace(model=...)` is another.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from boundloop.contracts import (
    SESSION_WORKFLOW,
    RunInput,
    SessionInput,
    SessionStatus,
    run_input,
)
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.session import SessionLimits
from boundloop.tools.registry import Toolset, tool_names

if TYPE_CHECKING:
    from boundloop.client import Run, Session

Deps = TypeVar("Deps")

#: Where runs go unless told otherwise (the default of `boundloop.Worker` too).
DEFAULT_TASK_QUEUE = "boundloop"


@dataclass(frozen=True)
class Agent(Generic[Deps]):
    """One agent, run many times.

    - tools: the toolset its worker serves (`Worker(client, agent, ...)` needs it), or
      the names of tools a worker on `task_queue` serves (enough to start runs).
    - model, api: the model name and which OpenAI API the worker speaks to it
      (`responses` or `chat`).
    - instructions: the system prompt of every run.
    - limits, policy: each run's bounds and approval rules (`boundloop.Limits`,
      `boundloop.Policy`); for a session, each turn's.
    - budget: a shared budget's key (`boundloop budget set KEY`) every run spends from;
      needs `limits.max_output_tokens`.
    - task_queue: where its runs go and where its worker polls.
    - mcp_tools: declarations of the worker's MCP tools the runs may call
      (`await worker.mcp_tools()`, `boundloop.list_mcp_tools(servers)`).
    - allowed: the tools a run may call, a subset of `tools` and `mcp_tools` (default:
      all of them).
    - stream: request each answer as a stream, so its text reaches `run.stream()` as it
      is written (docs/streaming.md); False for a provider whose streams misbehave.
    """

    tools: Toolset[Deps] | Sequence[str | Callable[..., Any]]
    _: KW_ONLY
    model: str = "gpt-5-mini"
    api: Literal["responses", "chat"] = "responses"
    instructions: str | None = None
    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    budget: str | None = None
    task_queue: str = DEFAULT_TASK_QUEUE
    mcp_tools: Sequence[MCPToolDeclaration] = ()
    allowed: Sequence[str] | None = None
    stream: bool = True
    #: model, API, limits, policy and budget, validated together (made from the above).
    settings: RunSettings = field(init=False, repr=False, compare=False)
    #: the tools each run may call, in order (made from the above).
    tool_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Validated once, here: raises pydantic's ValidationError or ValueError.
        settings = RunSettings(model=self.model, api=self.api, limits=self.limits,
                               policy=self.policy, budget=self.budget, stream=self.stream)
        available = tool_names(self.tools)
        available += [d.name for d in self.mcp_tools if d.name not in available]
        if self.allowed is not None:
            unknown = [n for n in self.allowed if n not in available]
            if unknown:
                raise ValueError(f"unknown tools {unknown}; available: {available}")
            names = list(dict.fromkeys(self.allowed))
        else:
            names = available
        if not names:
            raise ValueError("the agent has no tools; give it at least one")
        named = {**settings.limits.per_tool_max_calls, **settings.policy.approvers}
        strangers = [n for n in named if n not in available]
        if strangers:
            raise ValueError(f"limits/policy name tools that do not exist: {strangers}")
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "tool_names", tuple(names))

    @property
    def toolset(self) -> Toolset[Deps]:
        """The toolset its worker serves; an agent made from tool names has none."""
        if not isinstance(self.tools, Toolset):
            raise TypeError("this agent names its tools (it was not given a Toolset): a "
                            "worker needs the toolset itself, Agent(toolset, ...)")
        return self.tools

    def replace(self, **changes: Any) -> Agent[Deps]:
        """Another agent: this one with `changes` (validated again)."""
        return dataclasses.replace(self, **changes)

    def run_input(self, question: str, *, search_attributes: bool = True) -> RunInput:
        """The workflow input of one run with `question` (`contracts.run_input`, which
        the session workflow calls for each turn)."""
        return run_input(question, instructions=self.instructions, settings=self.settings,
                         tools=self.tool_names, mcp_tools=self.mcp_tools,
                         search_attributes=search_attributes)

    async def start(self, client: Client, question: str, *, id: str | None = None,
                    tenant: str | None = None) -> Run:
        """Start a run with `question`. `id` is its workflow id (`boundloop run --id`):
        each run needs a new one (default: a fresh `boundloop-…` id), since ids scope
        idempotency keys, so a used one is refused (`RunIdTaken`), and so is the id of a
        session's turn (`SESSION/turn-N`). `tenant`: the run's `BoundloopTenant` search
        attribute (`boundloop run --tenant`), from which an operator's policy may derive
        the budget key it spends from."""
        from boundloop.client import Run, search_attributes_registered, start_run

        # Built once: the run upserts its search attributes only where they are registered.
        inp = self.run_input(question,
                             search_attributes=await search_attributes_registered(client))
        handle = await start_run(client, inp, workflow_id=id, task_queue=self.task_queue,
                                 tenant=tenant)
        return Run(handle)

    async def session(self, client: Client, *, limits: SessionLimits | None = None,
                      id: str | None = None, tenant: str | None = None) -> Session:
        """Start a session: one conversation whose turns each run this agent, within
        `limits` (turns, a token budget across turns, the idle time after which it
        ends). Send messages with `Session.say`. `id` is its workflow id (`boundloop session
        start --id`); a session's id is never reused (`RunIdTaken`). `tenant`: the
        session's `BoundloopTenant` search attribute, which each of its turns carries
        (`boundloop session start --tenant`; as `start`'s)."""
        from boundloop.client import (
            Session,
            id_taken,
            search_attributes_registered,
            tenant_attribute,
        )

        allowed = set(self.tool_names)
        inp = SessionInput(instructions=self.instructions, settings=self.settings,
                           tools=list(self.tool_names),
                           mcp_tools=[d for d in self.mcp_tools if d.name in allowed],
                           limits=limits or SessionLimits(),
                           search_attributes=await search_attributes_registered(client))
        wf_id = id or f"boundloop-session-{uuid.uuid4().hex[:12]}"
        try:
            handle = await client.start_workflow(
                SESSION_WORKFLOW, inp, id=wf_id, task_queue=self.task_queue,
                result_type=SessionStatus,
                static_summary=f"session · model {self.model} · tools "
                               f"{', '.join(inp.tools)}",
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=tenant_attribute(tenant))
        except WorkflowAlreadyStartedError:
            raise id_taken(wf_id, "session") from None
        return Session(client, handle)
