"""boundloop's worker, public: the workflow, the model activity and the tool activity.

- `Plugin(toolset, deps=..., model=...)` adds boundloop to a Temporal worker you already
  run (`temporalio.worker.Worker(client, task_queue=..., plugins=[plugin])`), or to a
  Replayer.
- `Worker(client, toolset, deps=..., model=...)` is a Temporal worker with the plugin and
  boundloop's defaults (bounded workflow cache, a short-enough sticky timeout).

The settings-driven `boundloop worker` command is worker/main.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar

import openai
import temporalio.worker
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ReplayerConfig,
    WorkerConfig,
    WorkerDeploymentConfig,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from boundloop import signing
from boundloop.activities.admission import Admissions
from boundloop.activities.budget import (
    budget_closed_runs,
    budget_release,
    budget_reserve,
    budget_settle,
)
from boundloop.activities.conversation import ConversationCache
from boundloop.activities.earlier import earlier_calls, earlier_child
from boundloop.activities.heartbeat import HEARTBEAT_EVERY
from boundloop.activities.model import ModelActivities
from boundloop.activities.threads import ToolThreads
from boundloop.activities.tools import ToolActivities
from boundloop.agent import DEFAULT_TASK_QUEUE, Agent
from boundloop.codec import PlainGuardCodec
from boundloop.core import signatures
from boundloop.core.operator import OperatorPolicy, budget_admin_keys, unserved_tools_line
from boundloop.errors import BoundloopError, PolicyNamesUnservedTools
from boundloop.logs import tool_error_messages_from_env
from boundloop.mcp import (
    MCPPool,
    MCPServerConfig,
    MCPServerError,
    MCPToolDeclaration,
)
from boundloop.mcp.pool import check_commands
from boundloop.signing import KeyFileError
from boundloop.tools import catalog
from boundloop.tools.registry import Toolset
from boundloop.workflows.budget import BudgetLedgerWorkflow
from boundloop.workflows.loop import BoundLoopWorkflow
from boundloop.workflows.session import BoundloopSessionWorkflow
from boundloop.workflows.versioned import VERSIONED


def pass_boundloop_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    """The sandbox re-imports a workflow's module, its parent packages and everything
    they import that is not passed through, once for every run it holds: boundloop,
    workflows included, is passed through, so a worker keeps one copy of it (the
    toolset table the worker registered, one class per model) and a run costs only its
    own state. Our workflow modules keep no state of their own at module level, and the
    committed histories replay against this configuration (tests/test_replay.py)."""
    if runner is None:
        raise BoundloopError("no workflow runner to configure")
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    # Approval signatures are verified in the workflow: `cryptography`'s native module
    # must be the one loaded copy (re-importing it in the sandbox aborts the process).
    return dataclasses.replace(
        runner, restrictions=runner.restrictions.with_passthrough_modules(
            "boundloop", "cryptography"))

Deps = TypeVar("Deps")
#: Activities one worker runs at once unless told otherwise.
ACTIVITY_SLOTS = 64

#: A worker cannot require encrypted runs while writing its own payloads in clear.
NO_KEYS_TO_REQUIRE = ("the operator's policy requires encrypted payloads (require_encryption) "
                      "but this worker has no codec keys: set BOUNDLOOP_CODEC_KEYS or "
                      "BOUNDLOOP_CODEC_KEY (or connect with codec=…)")


def keep_codec(existing: DataConverter | None) -> DataConverter:
    """The pydantic data converter, keeping the payload codec (encryption) of the
    client's converter."""
    if existing is not None and issubclass(existing.payload_converter_class,
                                           PydanticPayloadConverter):
        return existing
    return dataclasses.replace(pydantic_data_converter,
                               payload_codec=existing.payload_codec if existing else None)


class Plugin(SimplePlugin, Generic[Deps]):
    """boundloop's workflow and activities for a worker (or Replayer) you build.

    - agent: the `boundloop.Agent` whose tools this worker serves (or the toolset
      itself); the workflow reads their rules from it.
    - model: the OpenAI (or compatible) client the model activity uses; its retries are
      turned off (Temporal's retry policy is the only retry layer). Not needed for a
      Replayer.
    - deps: handed to every tool as `ctx.deps`; a toolset made as `Toolset[SomeDeps]()`
      refuses (TypeError, here) deps that are not a SomeDeps.
    - log_tool_error_messages: log an unexpected tool exception's message with its
      traceback (default: the BOUNDLOOP_LOG_TOOL_ERRORS environment variable, else off:
      messages may hold raw arguments or data).
    - conversation_cache: conversations (and tool outputs x8) kept in memory for the
      next model request; a miss rebuilds it from the run's history (0: always).
    - approver_keys: approver name -> Ed25519 public key (`ed25519:BASE64`): when given,
      the runs this worker serves accept only decisions signed by one of them (with the
      run policy's own `approver_keys` for other names). Every worker of a task queue
      needs the same keys, as it needs the same toolset.
    - mcp_servers: MCP servers whose tools runs may call (docs/mcp.md). The worker owns
      their sessions: started (and listed) before it polls, closed when it stops.
    - policy: the operator's policy (boundloop.OperatorPolicy, docs/security.md): every
      run this worker starts is admitted under it once, and refused (PolicyRefused)
      when its own settings are looser.
    - own_task_queue: also serve the activities on a task queue only this worker polls
      (`<task_queue>/worker-<random>`), where a run sends its next steps after this
      worker answered a model request, so they find the conversation in this cache
      (default on; off: every worker may take every step, and more of them read the
      history). With several workers, leave it on (docs/history.md, "Several workers").

    The client must use the pydantic data converter (`boundloop.connect` sets it, as
    does passing this plugin to `Client.connect`).
    """

    def __init__(self, agent: Agent[Deps] | Toolset[Deps], *, deps: Deps,
                 model: openai.AsyncOpenAI | None = None,
                 log_tool_error_messages: bool | None = None,
                 conversation_cache: int = 512,
                 own_task_queue: bool = True,
                 approver_keys: Mapping[str, str] | None = None,
                 mcp_servers: Sequence[MCPServerConfig] = (),
                 policy: OperatorPolicy | None = None,
                 deployment_name: str | None = None,
                 build_id: str | None = None) -> None:
        self.deployment = deployment_version(deployment_name, build_id)
        toolset = agent.toolset if isinstance(agent, Agent) else agent
        # A Replayer (no model, no deps) runs no tool; any other worker's deps are checked
        # here, not met as an AttributeError in each run's first tool call.
        problem = None if model is None and deps is None else toolset.deps_problem(deps)
        if problem is not None:
            raise TypeError(problem)
        if log_tool_error_messages is None:
            log_tool_error_messages = tool_error_messages_from_env()
        self.toolset = toolset
        self.policy = policy
        keys = _checked_keys(approver_keys)
        self.served = catalog.Served(toolset, keys, budget_admin_keys(policy, keys))
        check_commands(mcp_servers)  # a missing program, named, before anything starts
        self.mcp = MCPPool(mcp_servers) if mcp_servers else None
        if self.mcp is None:  # with MCP servers, once they have listed their tools
            self._check_policy_tools(toolset.names())
        self._mcp_listed = asyncio.Event()
        self._mcp_failure: Exception | None = None
        cache = ConversationCache(capacity=conversation_cache)
        #: The conversations kept for the next model request (its hits, misses and
        #: rebuilds are counted).
        self.cache = cache
        # Sync tools get threads of their own, as many as the worker's activity slots
        # (sized in configure_worker): not asyncio's small shared pool.
        self.threads = ToolThreads(ACTIVITY_SLOTS)
        tools = ToolActivities(toolset, deps, cache, threads=self.threads,
                               log_error_messages=log_tool_error_messages, mcp=self.mcp)
        # The budget ledger runs on every boundloop worker: runs reserve from it, and
        # `boundloop budget set` starts it on the same task queue.
        activities: list[Callable[..., Any]] = [tools.tool_execute, budget_reserve,
                                                budget_settle, budget_release,
                                                budget_closed_runs, earlier_calls,
                                                earlier_child,
                                                Admissions(policy, toolset,
                                                           self.served.approver_keys,
                                                           mcp=self.mcp).admit_run]
        if model is not None:
            activities.append(ModelActivities(model, toolset, cache).model_request)
        self._activities = activities
        self._own_queue = own_task_queue and model is not None
        workflows: list[type] = [BoundLoopWorkflow, BudgetLedgerWorkflow,
                                 BoundloopSessionWorkflow]
        if self.deployment is not None:  # each with its versioning behaviour
            workflows = [VERSIONED.get(w, w) for w in workflows]
        super().__init__("boundloop", data_converter=keep_codec,
                         workflows=workflows,
                         activities=activities,
                         workflow_runner=pass_boundloop_through)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        converter = config["client"].data_converter
        if not issubclass(converter.payload_converter_class, PydanticPayloadConverter):
            raise BoundloopError("the client does not use the pydantic data converter: "
                                 "connect with boundloop.connect(...) or pass "
                                 "data_converter=pydantic_data_converter to Client.connect")
        if self.policy is not None and self.policy.require_encryption and isinstance(
                converter.payload_codec, (type(None), PlainGuardCodec)):
            raise BoundloopError(NO_KEYS_TO_REQUIRE)
        config = super().configure_worker(config)
        # The own task queue's worker has as many activity slots again (and threads).
        self.threads.size = ((config.get("max_concurrent_activities") or ACTIVITY_SLOTS)
                             * (2 if self._own_queue else 1))
        # Send each heartbeat at once (not up to 80% of the heartbeat timeout later): a
        # cancel reaches a running activity within about a second.
        config["max_heartbeat_throttle_interval"] = min(
            config.get("max_heartbeat_throttle_interval") or timedelta(seconds=60),
            timedelta(seconds=HEARTBEAT_EVERY))
        if self.deployment is not None:
            config["deployment_config"] = WorkerDeploymentConfig(
                version=self.deployment, use_worker_versioning=True)
        catalog.register(config.get("task_queue"), self.served)
        return config

    async def run_worker(self, worker: temporalio.worker.Worker,
                         next: Callable[[temporalio.worker.Worker], Awaitable[None]]) -> None:
        try:
            if self.mcp is not None:
                # Sessions before polling: a server that cannot start stops the worker
                # here, named, rather than failing every run's first call.
                try:
                    await self.mcp.start()
                except Exception as exc:
                    self._mcp_failure = exc  # for a caller waiting in mcp_tools()
                    self._mcp_listed.set()
                    await self.mcp.close()  # the servers that did start
                    raise
                self._mcp_failure = None
                self._mcp_listed.set()
                try:
                    self._check_policy_tools([*self.toolset.names(),
                                              *(d.name for d in self.mcp.declarations())])
                except PolicyNamesUnservedTools:
                    await self.mcp.close()
                    raise
            try:
                if not self._own_queue:
                    await super().run_worker(worker, next)
                else:
                    # This worker's own task queue (docs/history.md, "Several workers").
                    own = self._own_queue_worker(worker)
                    self.cache.queue = own.task_queue
                    try:
                        async with own:
                            await super().run_worker(worker, next)
                    finally:
                        self.cache.queue = None
            finally:
                if self.mcp is not None:
                    self._mcp_listed.clear()
                    await self.mcp.close()
        finally:
            catalog.unregister(worker.task_queue, self.served)

    def _check_policy_tools(self, served: list[str]) -> None:
        """Every tool name or glob of the operator's policy matches a tool served here
        (before the worker polls: a typo never reaches a run)."""
        line = None if self.policy is None else unserved_tools_line(self.policy, served)
        if line is not None:
            raise PolicyNamesUnservedTools(line)

    async def mcp_tools(self) -> list[MCPToolDeclaration]:
        """The tools this worker's MCP servers declared when it started them (waits for
        the worker to start; none without MCP servers): pass them to `boundloop.start`."""
        if self.mcp is None:
            return []
        await self._mcp_listed.wait()
        if self._mcp_failure is not None:
            raise MCPServerError(f"the worker's MCP servers did not start: "
                                 f"{self._mcp_failure}")
        return self.mcp.declarations()

    def _own_queue_worker(self, worker: temporalio.worker.Worker) -> temporalio.worker.Worker:
        """The same activities (and cache) on a task queue only this worker polls, where
        a run sends its next activities after this worker answered a model request."""
        config = worker.config()
        return temporalio.worker.Worker(
            worker.client, task_queue=f"{worker.task_queue}/worker-{uuid.uuid4().hex[:12]}",
            activities=self._activities, interceptors=config.get("interceptors") or (),
            max_concurrent_activities=config.get("max_concurrent_activities"),
            max_heartbeat_throttle_interval=config.get("max_heartbeat_throttle_interval")
            or timedelta(seconds=HEARTBEAT_EVERY),
            graceful_shutdown_timeout=config.get("graceful_shutdown_timeout")
            or timedelta())

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        # A Replayer replays histories of any task queue, with its own toolset.
        catalog.register_replayer(self.served)
        return super().configure_replayer(config)


class Worker(temporalio.worker.Worker, Generic[Deps]):
    """A Temporal worker serving the runs of `agent` (its toolset).

    - client: from `boundloop.connect` (the pydantic data converter).
    - agent (or a toolset), deps, model, log_tool_error_messages, conversation_cache,
      own_task_queue: see `Plugin`.
    - task_queue: where the agent's runs go (default: the agent's `task_queue`).
    - max_cached_workflows: workflow instances kept in memory (default 100); a run parked
      on approval beyond it is evicted and replays its short history when the decision
      arrives, so 1,000 parked runs cost little memory.
    - sticky_timeout: how long a run's next workflow task waits for the worker that ran
      the previous one before any worker may take it (Temporal's default 10 s); after a
      worker crash, a decision waits this long.
    - max_concurrent_activities: model requests and tool executions at once (default 64),
      on the shared queue and again on the worker's own queue.
    - approver_keys: see `Plugin`.
    - mcp_servers: MCP servers whose tools runs may call (see `Plugin`).
    - policy: the operator's policy (see `Plugin`).
    - deployment_name, build_id: worker versioning (see `Plugin`, docs/deploying.md).
    - plugins: more Temporal worker plugins.
    """

    def __init__(self, client: Client, agent: Agent[Deps] | Toolset[Deps], *, deps: Deps,
                 model: openai.AsyncOpenAI, task_queue: str | None = None,
                 max_cached_workflows: int = 100,
                 sticky_timeout: timedelta = timedelta(seconds=10),
                 max_concurrent_activities: int = ACTIVITY_SLOTS,
                 log_tool_error_messages: bool | None = None,
                 conversation_cache: int = 512,
                 approver_keys: Mapping[str, str] | None = None,
                 mcp_servers: Sequence[MCPServerConfig] = (),
                 own_task_queue: bool = True,
                 policy: OperatorPolicy | None = None,
                 deployment_name: str | None = None, build_id: str | None = None,
                 plugins: Sequence[temporalio.worker.Plugin] = ()) -> None:
        if task_queue is None:
            task_queue = agent.task_queue if isinstance(agent, Agent) else DEFAULT_TASK_QUEUE
        self.plugin = Plugin(agent, deps=deps, model=model,
                             log_tool_error_messages=log_tool_error_messages,
                             conversation_cache=conversation_cache,
                             own_task_queue=own_task_queue,
                             approver_keys=approver_keys, mcp_servers=mcp_servers,
                             policy=policy, deployment_name=deployment_name,
                             build_id=build_id)
        super().__init__(client, task_queue=task_queue, plugins=[self.plugin, *plugins],
                         max_cached_workflows=max_cached_workflows,
                         sticky_queue_schedule_to_start_timeout=sticky_timeout,
                         max_concurrent_activities=max_concurrent_activities)

    async def mcp_tools(self) -> list[MCPToolDeclaration]:
        """The declarations of this worker's MCP tools, once it has started its servers."""
        return await self.plugin.mcp_tools()


def deployment_version(deployment_name: str | None,
                       build_id: str | None) -> WorkerDeploymentVersion | None:
    """The worker's Worker Deployment version, or None (unversioned). Raises ValueError
    for one without the other, or an empty one."""
    if deployment_name is None and build_id is None:
        return None
    if not deployment_name or not build_id:
        raise ValueError("worker versioning needs both a deployment name and a build id "
                         f"(got deployment_name={deployment_name!r}, build_id={build_id!r})")
    if "." in deployment_name:  # Temporal writes a version as `<name>.<build id>`
        raise ValueError(f"deployment name {deployment_name!r} must not contain '.'")
    return WorkerDeploymentVersion(deployment_name=deployment_name, build_id=build_id)


def _checked_keys(keys: Mapping[str, str] | None) -> dict[str, str]:
    """Every key valid, every name an approver name: a bad one fails the worker at once,
    not each run's first decision."""
    out: dict[str, str] = {}
    for name, key in (keys or {}).items():
        try:
            signing.check_name(name)
            signatures.public_key(key)
        except ValueError as exc:
            raise KeyFileError(f"approver key of {name[:100]!r}: {exc}") from None
        out[name] = key
    return out
