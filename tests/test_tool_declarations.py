"""Declaring tools: the schema comes from the signature, the description from the
docstring; whatever boundloop cannot serve is refused when it is registered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from temporalio.common import RetryPolicy

import boundloop
from boundloop import ToolContext, ToolDefinitionError, Toolset
from boundloop.tools.registry import strict_json_schema


def definition(ts: Toolset[Any], name: str) -> dict[str, Any]:
    (found,) = ts.openai_tools([name], "responses")
    return found


def test_schema_and_description_come_from_the_signature_and_docstring() -> None:
    ts = Toolset[None]()

    @ts.tool()
    def lookup(ctx: ToolContext[None], sku: Annotated[str, Field(description="SKU")],
               count: int) -> dict[str, Any]:
        """Look up a SKU.

        Returns its stock."""
        return {}

    spec = ts.get("lookup")
    assert spec.takes_context and not spec.is_async
    assert definition(ts, "lookup") == {
        "type": "function", "name": "lookup", "description": "Look up a SKU.\n\nReturns its stock.",
        "strict": True, "parameters": {
            "type": "object", "additionalProperties": False, "required": ["sku", "count"],
            "properties": {"sku": {"type": "string", "description": "SKU"},
                           "count": {"type": "integer"}}}}


def test_a_field_named_title_stays_in_the_schema() -> None:
    class Ticket(BaseModel):
        model_config = ConfigDict(extra="forbid")
        title: str
        description: str

    schema = strict_json_schema(Ticket)
    assert schema["required"] == ["title", "description"]
    assert set(schema["properties"]) == {"title", "description"}
    assert "title" not in schema


def test_a_tool_with_defaults_is_sent_non_strict_with_only_required_fields_required() -> None:
    ts = Toolset[None]()

    @ts.tool()
    def search(query: str, limit: int = 3) -> list[str]:
        """Search."""
        return []

    found = definition(ts, "search")
    assert found["strict"] is False
    params = found["parameters"]
    assert params["required"] == ["query"] and params["additionalProperties"] is False
    assert params["properties"]["limit"]["default"] == 3


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int


def test_an_explicit_args_model_and_an_async_function() -> None:
    ts = Toolset[None]()

    @ts.tool(args_model=Args, description="Double x.")
    async def double(args: Args) -> int:
        return args.x * 2

    spec = ts.get("double")
    assert spec.is_async and spec.takes_model and spec.args_model is Args
    assert definition(ts, "double")["parameters"]["required"] == ["x"]


def test_a_decorated_function_stays_callable() -> None:
    ts = Toolset[None]()

    @ts.tool()
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    assert add(2, 3) == 5


def _lambda() -> Callable[..., Any]:
    return lambda x: x


def _undocumented(x: int) -> int:
    return x


def _star_args(*args: int) -> int:
    """Sums."""
    return sum(args)


def _kwargs(**kw: int) -> int:
    """Sums."""
    return 0


def _unannotated(x, y: int) -> int:  # type: ignore[no-untyped-def]
    """Adds."""
    return int(x) + y


def _context_second(x: int, ctx: ToolContext[None]) -> int:
    """Context in the wrong place."""
    return x


def _ctx_not_a_context(ctx: dict[str, Any], x: int) -> int:
    """A first parameter called ctx that is not the context."""
    return x


def _generator(x: int) -> Iterator[int]:
    """Yields."""
    yield x


def _bad_type(x: Callable[[int], int]) -> int:
    """A parameter no JSON schema describes."""
    return 0


@pytest.mark.parametrize(("fn", "options", "says"), [
    (_lambda(), {}, "not valid"),
    (_lambda(), {"name": "echo", "description": "Echo."}, "no type annotation"),
    (_undocumented, {}, "no description"),
    (_star_args, {}, "*args"),
    (_kwargs, {}, "**kw"),
    (_unannotated, {}, "'x' has no type annotation"),
    (_context_second, {}, "must be the first"),
    (_ctx_not_a_context, {}, "not ToolContext"),
    (_generator, {}, "generator"),
    (_bad_type, {}, "JSON schema"),
    (_undocumented, {"description": "x", "retry": RetryPolicy(maximum_attempts=0)},
     "unlimited retries"),
    (_undocumented, {"description": "x", "timeout": timedelta(0)}, "timeout"),
    (_undocumented, {"description": "x", "args_model": dict}, "pydantic model"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_unsupported_callables_are_refused_at_registration(
        fn: Callable[..., Any], options: dict[str, Any], says: str) -> None:
    ts = Toolset[None]()
    with pytest.raises(ToolDefinitionError) as info:
        ts.tool(**options)(fn)
    assert says in str(info.value)
    assert ts.names() == []


def test_an_annotation_that_does_not_resolve_says_so() -> None:
    class Local(BaseModel):
        x: int

    def uses_local(arg: Local) -> int:  # a string annotation (postponed evaluation)
        """Uses a class only this test knows."""
        return 0

    with pytest.raises(ToolDefinitionError, match="does not resolve"):
        Toolset[None]().tool()(uses_local)


def test_a_name_registered_twice_is_refused() -> None:
    ts = Toolset[None]()
    ts.tool(description="x")(_undocumented)
    with pytest.raises(ToolDefinitionError, match="twice"):
        ts.tool(description="y")(_undocumented)


def test_public_names_are_exported() -> None:
    for name in boundloop.__all__:
        assert getattr(boundloop, name) is not None
