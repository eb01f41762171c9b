"""An agent: tools, model, API, instructions, limits, policy and task queue, defined once.

    agent = boundloop.Agent(tools, model="gpt-5-mini", instructions="...",
                            limits=boundloop.Limits(max_steps=8))
    async with boundloop.Worker(client, agent, deps=MyDeps(), model=AsyncOpenAI()):
        run = await agent.start(client, "question")
        session = await agent.session(client)

`start` and `start_session` start one run or session without keeping an agent. Everything
is checked when the agent is made (pydantic: limits, policy, model and budget
together; the tools that limits and policy name), so a run or session it starts is never
refused for its settings. The agent is immutable: `agent.replace(model=...)` is another.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, Literal, TypeVar

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from boundloop import errors
from boundloop import search_attributes as sa
from boundloop.client import Run, Session
from boundloop.contracts import (
    SESSION_WORKFLOW,
    WORKFLOW_NAME,
    RunInput,
    RunResult,
    SessionInput,
    SessionStatus,
    run_input,
)
from boundloop.core import session as session_core
from boundloop.core.canonical import compact_json, preview
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.session import SessionLimits
from boundloop.core.tree import AgentTool
from boundloop.tools.registry import Toolset, tool_names

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
    - agents: other agents its model may call as tools (`other.as_tool(...)`), each
      started as a sub-agent's run within an allowance of this run's limits
      (docs/agent-trees.md).
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
    agents: Sequence[AgentTool] = ()
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
                hint = ("; sub-agents are offered to the model without being listed in "
                        "`allowed`" if set(unknown) & {a.name for a in self.agents} else "")
                raise ValueError(f"unknown tools {unknown}; available: {available}{hint}")
            names = list(dict.fromkeys(self.allowed))
        else:
            names = available
        agent_names = [a.name for a in self.agents]
        clash = sorted({n for n in agent_names if n in available or agent_names.count(n) > 1})
        if clash:
            raise ValueError(f"sub-agents {clash} share a name with a tool or another "
                             "sub-agent; give each its own")
        if not names and not self.agents:
            raise ValueError("the agent has no tools; give it at least one")
        if isinstance(self.tools, Toolset):
            # One worker serves a tree on one task queue: its toolset must hold them all.
            served = set(available)
            missing = sorted({f"{path}: {t}" for path, t in _tools_on(
                self.agents, self.task_queue) if t not in served})
            if missing:
                raise ValueError(
                    f"sub-agents on this agent's task queue {self.task_queue!r} call tools "
                    f"its toolset does not serve ({', '.join(missing)}): the worker of "
                    "the queue serves them all; give the agents one Toolset (pick each "
                    "one's tools with `allowed`), or the sub-agent a task queue of its own")
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

    def as_tool(self, name: str, description: str, *,
                limits: Limits | None = None) -> AgentTool:
        """This agent as a tool of another (`Agent(..., agents=[researcher.as_tool(...)])`):
        the other's model calls `name` with a `question`, and the question runs as this
        agent's run, a child of the calling run, bounded by what the caller has left.
        `limits`: this sub-agent's own (default: the agent's); its allowance may cut
        them further. Its answer reaches the caller's model with its stop reason, steps,
        tokens and cost; a sub-agent a limit cut short is reported as such."""
        settings = self.settings if limits is None else RunSettings.model_validate(
            {**self.settings.model_dump(), "limits": limits})
        allowed = set(self.tool_names)
        return AgentTool(name=name, description=description, instructions=self.instructions,
                         settings=settings, tools=list(self.tool_names),
                         mcp_tools=[d for d in self.mcp_tools if d.name in allowed],
                         task_queue=self.task_queue, agents=list(self.agents))

    def on_queue(self, task_queue: str) -> Agent[Deps]:
        """This agent on `task_queue`, with every sub-agent that shared its queue (at any
        depth) moved there too: one worker on `task_queue` then serves the whole tree
        (a test's own queue, `boundloop.testing.AgentEnvironment`)."""
        return self.replace(task_queue=task_queue,
                            agents=[moved(a, self.task_queue, task_queue) for a in self.agents])

    def run_input(self, question: str, *, search_attributes: bool = True) -> RunInput:
        """The workflow input of one run with `question` (`contracts.run_input`, which
        the session workflow calls for each turn)."""
        return run_input(question, instructions=self.instructions, settings=self.settings,
                         tools=self.tool_names, mcp_tools=self.mcp_tools,
                         search_attributes=search_attributes, agents=self.agents)

    async def start(self, client: Client, question: str, *, id: str | None = None,
                    tenant: str | None = None) -> Run:
        """Start a run with `question`. `id` is its workflow id (`boundloop run --id`):
        each run needs a new one (default: a fresh `boundloop-…` id), since ids scope
        idempotency keys, so a used one is refused (`RunIdTaken`), and so is the id of a
        session's turn (`SESSION/turn-N`). `tenant`: the run's `BoundloopTenant` search
        attribute (`boundloop run --tenant`), from which an operator's policy may derive
        the budget key it spends from."""
        # Built once: the run upserts its search attributes only where they are registered.
        inp = self.run_input(question,
                             search_attributes=await _search_attributes_registered(client))
        handle = await _start_run(client, inp, workflow_id=id, task_queue=self.task_queue,
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
        if self.agents:
            raise ValueError("a session's turns do not call sub-agents: start runs "
                             "(agent.start) for an agent with `agents`")
        allowed = set(self.tool_names)
        inp = SessionInput(instructions=self.instructions, settings=self.settings,
                           tools=list(self.tool_names),
                           mcp_tools=[d for d in self.mcp_tools if d.name in allowed],
                           limits=limits or SessionLimits(),
                           search_attributes=await _search_attributes_registered(client))
        wf_id = id or f"boundloop-session-{uuid.uuid4().hex[:12]}"
        try:
            handle = await client.start_workflow(
                SESSION_WORKFLOW, inp, id=wf_id, task_queue=self.task_queue,
                result_type=SessionStatus,
                static_summary=f"session · model {self.model} · tools "
                               f"{', '.join(inp.tools)}",
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=_tenant_attribute(tenant))
        except WorkflowAlreadyStartedError:
            raise _id_taken(wf_id, "session") from None
        return Session(client, handle)


async def start(client: Client, question: str, *,
                tools: Toolset[Any] | Sequence[str | Callable[..., Any]],
                model: str = "gpt-5-mini", api: Literal["responses", "chat"] = "responses",
                limits: Limits | None = None, policy: Policy | None = None,
                instructions: str | None = None, id: str | None = None,
                task_queue: str = DEFAULT_TASK_QUEUE, budget: str | None = None,
                mcp_tools: Sequence[MCPToolDeclaration] = (),
                tenant: str | None = None) -> Run:
    """Start one run without keeping an agent: `Agent(tools, model=..., ...).start(client,
    question, id=..., tenant=...)` (see `boundloop.Agent` for each argument)."""
    agent: Agent[Any] = Agent(tools, model=model, api=api, limits=limits or Limits(),
                              policy=policy or Policy(), instructions=instructions,
                              task_queue=task_queue, budget=budget, mcp_tools=mcp_tools)
    return await agent.start(client, question, id=id, tenant=tenant)


async def start_session(client: Client, *,
                        tools: Toolset[Any] | Sequence[str | Callable[..., Any]],
                        model: str = "gpt-5-mini",
                        api: Literal["responses", "chat"] = "responses",
                        limits: Limits | None = None, policy: Policy | None = None,
                        session_limits: SessionLimits | None = None,
                        instructions: str | None = None, id: str | None = None,
                        task_queue: str = DEFAULT_TASK_QUEUE,
                        tenant: str | None = None) -> Session:
    """Start a session without keeping an agent: `Agent(tools, ...).session(client,
    limits=session_limits, id=..., tenant=...)`."""
    agent: Agent[Any] = Agent(tools, model=model, api=api, limits=limits or Limits(),
                              policy=policy or Policy(), instructions=instructions,
                              task_queue=task_queue)
    return await agent.session(client, limits=session_limits, id=id, tenant=tenant)


def _tools_on(agents: Sequence[AgentTool], queue: str,
              path: str = "") -> list[tuple[str, str]]:
    """(sub-agent path, tool) of every sub-agent on `queue`, at any depth below."""
    found: list[tuple[str, str]] = []
    for agent in agents:
        if agent.task_queue != queue:
            continue
        here = f"{path} → {agent.name}" if path else agent.name
        mcp = {d.name for d in agent.mcp_tools}
        found += [(here, t) for t in agent.tools if t not in mcp]
        found += _tools_on(agent.agents, queue, here)
    return found


def moved(agent: AgentTool, old: str, new: str) -> AgentTool:
    """`agent` and its sub-agents, those on task queue `old` moved to `new`."""
    return agent.model_copy(update={
        "task_queue": new if agent.task_queue == old else agent.task_queue,
        "agents": [moved(a, old, new) for a in agent.agents]})


# --- starting a run or a session (the agent's) -------------------------------------


async def _search_attributes_registered(client: Client) -> bool:
    """True when the server knows boundloop's search attributes (else runs skip them)."""
    try:
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace))
    except RPCError:
        return False
    return all(key.name in resp.custom_attributes for key in sa.ALL)


async def _start_run(client: Client, inp: RunInput, *, workflow_id: str | None = None,
                     task_queue: str, tenant: str | None = None
                     ) -> WorkflowHandle[Any, RunResult]:
    """Start the run of `inp`, as `contracts.run_input` built it (`Agent.start`): sent as
    it is."""
    wf_id = workflow_id or f"boundloop-{uuid.uuid4().hex[:12]}"
    if session_core.is_turn_id(wf_id):
        # Taken now, the session's next `say` would find its turn's id used.
        raise errors.RunIdTaken(f"workflow id {wf_id!r} is a session's turn id "
                                "(SESSION/turn-N): the session starts its turns under "
                                "those; choose another id")
    limits = compact_json(inp.settings.limits.model_dump(mode="json"))
    details = (f"model `{inp.settings.model}` ({inp.settings.api})\n\n"
               f"tools: {', '.join(inp.tools)}\n\nlimits: `{limits}`")
    # Idempotency keys are scoped by workflow id: a finished run's id is never
    # reused, or its side effects would be "already done" for the new run.
    try:
        return await client.start_workflow(
            WORKFLOW_NAME, inp, id=wf_id, task_queue=task_queue,
            result_type=RunResult, static_summary=preview(inp.question, 120),
            static_details=details, id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=_tenant_attribute(tenant))
    except WorkflowAlreadyStartedError:
        raise _id_taken(wf_id, "run") from None


def _tenant_attribute(tenant: str | None) -> TypedSearchAttributes | None:
    """The `BoundloopTenant` search attribute a run or session is started with."""
    return None if tenant is None else TypedSearchAttributes(
        [SearchAttributePair(sa.TENANT, tenant)])


def _id_taken(workflow_id: str, what: str) -> errors.RunIdTaken:
    return errors.RunIdTaken(f"workflow id {workflow_id!r} is already used; each {what} "
                             "needs its own (ids scope the idempotency keys of side effects)")
