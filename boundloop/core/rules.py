"""Argument-aware tool rules: data, parsed safely, evaluated deterministically.

A rule names a tool (or a glob such as `delete_*`), an optional condition over the
call's validated arguments (`amount > 100`, `priority in ["high", "urgent"]`,
`customer.tier == "gold" and not refund`) and an action: `allow`, `ask` (a person
approves) or `deny` (the model gets a `blocked` envelope naming the rule).

Conditions are parsed with Python's own parser into a syntax tree and only a small set
of node kinds is accepted (comparisons, `and`/`or`/`not`, dotted paths, JSON literals);
nothing is ever evaluated as code. Evaluation reads JSON values only, so it runs the
same way every time (it runs in the workflow).

Strictest match wins (deny > ask > allow), whatever the order: adding rules can only
tighten. A condition that cannot be decided (a missing field, comparing a number with a
text) counts as matching for `ask` and `deny` and as not matching for `allow`: when in
doubt, a person decides.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Action", "ArgumentRule", "ConditionError", "Grant", "Verdict", "evaluate", "matches",
           "parse_condition"]

Action = Literal["allow", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
#: Bounds keep a rule a line a person reads, and parsing cheap.
CONDITION_MAX = 500
_NESTING_MAX = 32
#: Tool names and globs: the characters of tool names plus glob's `*?[]`.
TOOL_PATTERN = r"^[A-Za-z0-9_*?\[\]!.:-]{1,128}$"


class ConditionError(ValueError):
    """A condition that is not in the rule language (raised at validation)."""


class _Undecidable(Exception):
    """The condition cannot be decided for these arguments."""


_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None,
                              "True": True, "False": False, "None": None}
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)


def _check(node: ast.AST, depth: int = 0) -> None:
    """Refuse every node kind outside the rule language, naming what was found."""
    if depth > _NESTING_MAX:
        raise ConditionError(f"nested deeper than {_NESTING_MAX} levels")
    match node:
        case ast.BoolOp(values=values):
            for value in values:
                _check(value, depth + 1)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            _check(operand, depth + 1)
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int() | float() as v)) \
                if not isinstance(v, bool):
            pass
        case ast.Compare(left=left, ops=ops, comparators=rights):
            for op in ops:
                if not isinstance(op, _COMPARISONS):
                    raise ConditionError(f"unsupported comparison {type(op).__name__}")
            for operand in (left, *rights):
                _check_operand(operand, depth + 1)
        case ast.Name() | ast.Attribute():
            _path(node)
        case ast.Constant(value=bool()):
            pass
        case _:
            raise ConditionError(_what(node) + " is not a condition (use comparisons, "
                                 "and/or/not, dotted argument paths and JSON literals)")


def _check_operand(node: ast.AST, depth: int) -> None:
    match node:
        case ast.Constant(value=None | bool() | int() | float() | str()):
            pass
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int() | float() as v)) \
                if not isinstance(v, bool):
            pass
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            for elt in elts:
                _check_operand(elt, depth + 1)
        case ast.Name() | ast.Attribute():
            _path(node)
        case _:
            raise ConditionError(f"{_what(node)} cannot be compared (use an argument path, "
                                 "a number, a quoted text, true/false/null or a [list])")


def _what(node: ast.AST) -> str:
    kinds = {ast.Call: "a function call", ast.BinOp: "arithmetic", ast.Subscript: "indexing",
             ast.Lambda: "a lambda", ast.Dict: "a {mapping}", ast.IfExp: "if/else"}
    return kinds.get(type(node), f"{type(node).__name__}")


def _path(node: ast.AST) -> tuple[str, ...]:
    """`customer.tier` -> ("customer", "tier"); only names joined by dots."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ConditionError(f"{_what(node)} is not an argument path")
    parts.append(node.id)
    return tuple(reversed(parts))


@lru_cache(maxsize=512)
def parse_condition(text: str) -> ast.expr:
    """The checked syntax tree of a condition. Raises ConditionError saying what is wrong."""
    if not text.strip():
        raise ConditionError("the condition is empty")
    if len(text) > CONDITION_MAX:
        raise ConditionError(f"the condition is over {CONDITION_MAX} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise ConditionError(f"not a valid condition{where}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise ConditionError("not a valid condition") from None
    _check(tree.body)
    return tree.body


def _value(node: ast.expr, args: Mapping[str, Any]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.UnaryOp(operand=ast.Constant(value=int() | float() as number)):
            return -number
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            return [_value(e, args) for e in elts]
        case ast.Name(id=name) if name in _CONSTANTS and name not in args:
            return _CONSTANTS[name]
        case _:
            current: Any = args
            for part in _path(node):
                if not isinstance(current, Mapping) or part not in current:
                    raise _Undecidable
                current = current[part]
            return current


def _kind(value: Any) -> str:
    """JSON's kinds: booleans are not numbers here (`true > 0` is undecidable)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _equal(a: Any, b: Any) -> bool:
    if _kind(a) != _kind(b):
        return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _compare(op: ast.cmpop, a: Any, b: Any) -> bool:
    if isinstance(op, ast.Eq):
        return _equal(a, b)
    if isinstance(op, ast.NotEq):
        return not _equal(a, b)
    if isinstance(op, ast.In | ast.NotIn):
        if isinstance(b, list):
            found = any(_equal(a, item) for item in b)
        elif isinstance(b, str) and isinstance(a, str):
            found = a in b
        else:
            raise _Undecidable
        return found if isinstance(op, ast.In) else not found
    kind = _kind(a)
    if kind != _kind(b) or kind not in ("number", "str"):
        raise _Undecidable
    if isinstance(op, ast.Lt):
        return bool(a < b)
    if isinstance(op, ast.LtE):
        return bool(a <= b)
    if isinstance(op, ast.Gt):
        return bool(a > b)
    return bool(a >= b)


def _holds(node: ast.expr, args: Mapping[str, Any]) -> bool:
    match node:
        case ast.BoolOp(op=ast.And(), values=values):
            return all(_holds(v, args) for v in values)
        case ast.BoolOp(values=values):
            return any(_holds(v, args) for v in values)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _holds(operand, args)
        case ast.Compare(left=left, ops=ops, comparators=rights):
            a = _value(left, args)
            for op, right in zip(ops, rights, strict=True):
                b = _value(right, args)
                if not _compare(op, a, b):
                    return False
                a = b
            return True
        case _:
            value = _value(node, args)
            if not isinstance(value, bool):
                raise _Undecidable
            return value


class ArgumentRule(BaseModel):
    """One rule: for calls of `tool` whose arguments meet `when`, do `action`.

    - tool: a tool name, or a glob (`delete_*`, `shop__*`), matched case-sensitively.
    - when: a condition over the validated arguments; None matches every call.
    - action: `allow`, `ask` or `deny`.
    - reason: a short label shown to people next to the rule (`large transfer`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(pattern=TOOL_PATTERN)
    when: str | None = Field(default=None, max_length=CONDITION_MAX)
    action: Action
    reason: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("when")
    @classmethod
    def _parses(cls, when: str | None) -> str | None:
        if when is not None:
            try:
                parse_condition(when)
            except ConditionError as exc:
                raise ValueError(f"condition {when!r}: {exc}") from None
        return when

    @property
    def text(self) -> str:
        """The rule as people read it: its condition (or its tool pattern), and label."""
        core = self.when if self.when is not None else self.tool
        return core if self.reason is None else f"{core} ({self.reason})"


def matches(rule: ArgumentRule, tool: str, arguments: Mapping[str, Any]) -> bool:
    """Whether `rule` applies to this call; undecidable counts as the strict answer."""
    if not fnmatch.fnmatchcase(tool, rule.tool):
        return False
    if rule.when is None:
        return True
    try:
        return _holds(parse_condition(rule.when), arguments)
    except _Undecidable:
        return rule.action != "allow"
    except RecursionError:  # deeply nested arguments
        return rule.action != "allow"


class Verdict(BaseModel):
    """The strictest matching rule's action, and that rule."""

    model_config = ConfigDict(frozen=True)

    action: Action
    rule: ArgumentRule

    @property
    def text(self) -> str:
        return self.rule.text


def evaluate(rules: Iterable[ArgumentRule], tool: str,
             arguments: Mapping[str, Any]) -> Verdict | None:
    """The verdict of `rules` for one call, or None when no rule matches.

    Strictest match wins (deny > ask > allow); among equally strict matches, the first.
    """
    best: ArgumentRule | None = None
    for rule in rules:
        if matches(rule, tool, arguments) and (
                best is None or _STRICTNESS[rule.action] > _STRICTNESS[best.action]):
            best = rule
    return None if best is None else Verdict(action=best.action, rule=best)


class Grant(BaseModel):
    """A remembered approval: later calls of `tool` whose validated arguments meet `when`
    (every call when None) are approved as `approver` approved `call_id`, for the rest of
    the run (`scope` "run") or of the session whose turn the run is ("session")."""

    model_config = ConfigDict(frozen=True)

    tool: str
    when: str | None = Field(default=None, exclude_if=lambda v: v is None)
    approver: str
    call_id: str
    scope: Literal["run", "session"] = Field(default="run", exclude_if=lambda v: v == "run")

    @property
    def text(self) -> str:
        return self.tool if self.when is None else f"{self.tool} when {self.when}"

    def covers(self, tool: str, arguments: dict[str, Any]) -> bool:
        # Judged like an `allow` rule: an undecidable condition does not cover the call.
        rule = ArgumentRule(tool=self.tool, when=self.when, action="allow")
        return tool == self.tool and matches(rule, tool, arguments)
