"""Pure request validators imitating how the real OpenAI APIs reject malformed requests.

Each validator takes an already-decoded JSON request body and returns a list of human-readable
violation strings (empty means "the real API would accept this"). They never raise and never
mutate their input, so they can be unit-tested and reused outside the scripted server.

Messages copy the wording of the real API's 400 errors where that wording is known
(``"No tool output found for function call call_abc."``, ``"Missing required parameter:
'model'."``, ...), so that a bug reproduced against the scripted server reads like the
production error it imitates. Only the rules below are checked; everything else is accepted.

Responses API (``POST /v1/responses``), :func:`validate_responses_request`:

- ``model`` is a non-empty string.
- ``input`` (optional) is a string or a list of item objects. Items: messages (``role`` in
  user/assistant/system/developer), ``function_call`` (``call_id``/``name`` strings,
  ``arguments`` a *string*), ``function_call_output`` (``call_id``, ``output`` a string or a
  list of content parts), ``reasoning`` (``id``, ``summary`` list). No two items share an ``id``.
- Every ``function_call_output`` answers an earlier ``function_call`` (same ``call_id``) and
  every ``function_call`` is answered exactly once.
- A ``function_call`` that the server returned right after a ``reasoning`` item must be sent
  back with that reasoning item (same ``id``, same ``encrypted_content``) immediately before it;
  only other reasoning items may sit in between. This is what reasoning models require when a
  conversation is replayed statelessly (``store: false`` + ``include:
  ["reasoning.encrypted_content"]``).
- ``previous_response_id``, if present, names a response the server served; its conversation
  counts as context before ``input`` for the call/output pairing.
- ``tools`` (optional) is a list of objects; a ``function`` tool has top-level ``name`` and
  ``parameters`` (the Chat-style nested ``function`` object is the classic mistake).
- ``tool_choice`` (optional) is ``"none"``, ``"auto"``, ``"required"`` or an object.

Chat Completions (``POST /v1/chat/completions``), :func:`validate_chat_request`:

- ``model`` is a non-empty string; ``messages`` a non-empty list of objects whose ``role`` is
  system, developer, user, assistant or tool.
- An assistant message with ``tool_calls``: each call has a non-empty ``id``, ``type``
  ``"function"``, a non-empty ``function.name`` and ``function.arguments`` as a *string*; it is
  followed immediately by exactly one ``tool`` message per call id (any order), before any
  other message.
- A ``tool`` message has a ``tool_call_id`` answering the immediately preceding assistant
  ``tool_calls``, and ``content`` that is a string or a list of text parts.
- ``tools`` (optional) is a list of ``{"type": "function", "function": {"name": ...}}``;
  ``tool_choice`` as for the Responses API.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAT_ROLES",
    "RESPONSES_MESSAGE_ROLES",
    "TOOL_CHOICE_MODES",
    "RequiredReasoning",
    "conversation_after",
    "reasoning_requirements",
    "validate_chat_request",
    "validate_responses_request",
]

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
RESPONSES_MESSAGE_ROLES = ("assistant", "system", "developer", "user")
TOOL_CHOICE_MODES = ("none", "auto", "required")


@dataclass(frozen=True)
class RequiredReasoning:
    """A reasoning item that must be replayed immediately before a served function call."""

    reasoning_id: str
    encrypted_content: str | None
    function_call_item_id: str
    """The ``id`` of the served ``function_call`` item (its ``call_id`` if it had none)."""


# --------------------------------------------------------------------------------------------
# small helpers


def _json_type(value: object) -> str:
    """Name a JSON value's type the way the real API's messages do ("an object", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _supported(values: Sequence[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    if len(quoted) == 1:
        return quoted[0]
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def _missing(param: str) -> str:
    return f"Missing required parameter: '{param}'."


def _invalid_type(param: str, expected: str, value: object) -> str:
    return f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead."


def _invalid_value(param: str, value: object, supported: Sequence[str]) -> str:
    return f"Invalid value for '{param}': {value!r}. Supported values are: {_supported(supported)}."


def _empty_array(param: str) -> str:
    return (
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead."
    )


def _check_nonempty_string(obj: Mapping[str, Any], key: str, param: str) -> list[str]:
    if key not in obj or obj[key] is None:
        return [_missing(param)]
    value = obj[key]
    if not isinstance(value, str):
        return [_invalid_type(param, "a string", value)]
    if value == "":
        return [
            f"Invalid '{param}': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead."
        ]
    return []


def _check_model(body: Mapping[str, Any]) -> list[str]:
    return _check_nonempty_string(body, "model", "model")


def _check_tool_choice(body: Mapping[str, Any]) -> list[str]:
    if "tool_choice" not in body or body["tool_choice"] is None:
        return []
    choice = body["tool_choice"]
    if isinstance(choice, dict):
        return []
    if isinstance(choice, str):
        if choice in TOOL_CHOICE_MODES:
            return []
        return [_invalid_value("tool_choice", choice, TOOL_CHOICE_MODES)]
    return [_invalid_type("tool_choice", "a string or an object", choice)]


def _is_type(item: object, type_: str) -> bool:
    return isinstance(item, dict) and item.get("type") == type_


# --------------------------------------------------------------------------------------------
# Responses API


def reasoning_requirements(output: object) -> dict[str, RequiredReasoning]:
    """Which served function calls need their reasoning item replayed, keyed by ``call_id``.

    ``output`` is the ``output`` list of a served Responses API body. A ``reasoning`` item
    immediately followed by a ``function_call`` binds that call to the reasoning item. Anything
    malformed is ignored (a script may serve malformed output on purpose).
    """
    found: dict[str, RequiredReasoning] = {}
    if not isinstance(output, list):
        return found
    for before, after in itertools.pairwise(output):
        if not (_is_type(before, "reasoning") and _is_type(after, "function_call")):
            continue
        rs_id, call_id = before.get("id"), after.get("call_id")
        if not (isinstance(rs_id, str) and isinstance(call_id, str)):
            continue
        enc = before.get("encrypted_content")
        fc_id = after.get("id")
        found[call_id] = RequiredReasoning(
            reasoning_id=rs_id,
            encrypted_content=enc if isinstance(enc, str) else None,
            function_call_item_id=fc_id if isinstance(fc_id, str) else call_id,
        )
    return found


def _input_items(body: Mapping[str, Any]) -> list[Any]:
    """The request's ``input`` as a list of items (a string is one user message)."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if isinstance(inp, list):
        return list(inp)
    return []


def conversation_after(body: object, output: object, prior_items: Sequence[Any] = ()) -> list[Any]:
    """The whole conversation a served response ends: prior context + ``input`` + ``output``.

    This is what a later request's ``previous_response_id`` pointing at that response brings in
    as context (the real API stores it server-side).
    """
    items = list(prior_items)
    if isinstance(body, dict):
        items.extend(_input_items(body))
    if isinstance(output, list):
        items.extend(output)
    return items


def _tool_objects(body: Mapping[str, Any], out: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(path, tool) for each object in `tools`; shape problems are appended to `out`."""
    if "tools" not in body or body["tools"] is None:
        return []
    tools = body["tools"]
    if not isinstance(tools, list):
        out.append(_invalid_type("tools", "an array", tools))
        return []
    found: list[tuple[str, dict[str, Any]]] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict):
            found.append((f"tools[{i}]", tool))
        else:
            out.append(_invalid_type(f"tools[{i}]", "an object", tool))
    return found


def _check_responses_tools(body: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for p, tool in _tool_objects(body, out):
        if not isinstance(tool.get("type"), str):
            out.append(_missing(f"{p}.type"))
            continue
        if tool["type"] != "function":
            continue  # built-in tools (web_search, ...) have shapes of their own
        out.extend(_check_nonempty_string(tool, "name", f"{p}.name"))
        if "parameters" not in tool:
            out.append(_missing(f"{p}.parameters"))
        elif tool["parameters"] is not None and not isinstance(tool["parameters"], dict):
            out.append(_invalid_type(f"{p}.parameters", "an object", tool["parameters"]))
    return out


def _check_responses_item(item: object, p: str) -> list[str]:
    if not isinstance(item, dict):
        return [_invalid_type(p, "an input item object", item)]
    type_ = item.get("type")
    out: list[str] = []
    if type_ is None or type_ == "message":
        if "role" not in item:
            return [_missing(f"{p}.role")]
        if item["role"] not in RESPONSES_MESSAGE_ROLES:
            out.append(_invalid_value(f"{p}.role", item["role"], RESPONSES_MESSAGE_ROLES))
        if "content" not in item:
            out.append(_missing(f"{p}.content"))
    elif type_ == "function_call":
        out.extend(_check_nonempty_string(item, "call_id", f"{p}.call_id"))
        out.extend(_check_nonempty_string(item, "name", f"{p}.name"))
        if "arguments" not in item:
            out.append(_missing(f"{p}.arguments"))
        elif not isinstance(item["arguments"], str):
            out.append(_invalid_type(f"{p}.arguments", "a string", item["arguments"]))
    elif type_ == "function_call_output":
        out.extend(_check_nonempty_string(item, "call_id", f"{p}.call_id"))
        if "output" not in item:
            out.append(_missing(f"{p}.output"))
        else:
            output = item["output"]
            parts_ok = isinstance(output, list) and all(isinstance(x, dict) for x in output)
            if not (isinstance(output, str) or parts_ok):
                out.append(
                    _invalid_type(
                        f"{p}.output",
                        "one of a string or array of input content parts",
                        output,
                    )
                )
    elif type_ == "reasoning":
        out.extend(_check_nonempty_string(item, "id", f"{p}.id"))
        if not isinstance(item.get("summary"), list):
            out.append(_missing(f"{p}.summary"))
    return out


def _check_duplicate_ids(items: Sequence[Any]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        item_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(item_id, str):
            continue
        if item_id in seen:
            out.append(
                f"Duplicate item found with id {item_id}. "
                "Remove duplicate items from your input and try again."
            )
        seen.add(item_id)
    return out


def _check_call_pairing(items: Sequence[Any]) -> list[str]:
    """Every output answers an earlier call; every call is answered exactly once."""
    answers: dict[str, int] = {}
    out: list[str] = []
    for item in items:
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if not isinstance(call_id, str):
            continue
        if _is_type(item, "function_call"):
            if call_id in answers:
                out.append(f"Duplicate function call found with call_id {call_id}.")
            else:
                answers[call_id] = 0
        elif _is_type(item, "function_call_output"):
            if call_id not in answers:
                out.append(f"No tool call found for function call output with call_id {call_id}.")
                continue
            if answers[call_id] == 1:
                out.append(
                    f"Duplicate function call output found for call_id {call_id}: "
                    "each function call must be answered exactly once."
                )
            answers[call_id] += 1
    out.extend(
        f"No tool output found for function call {call_id}."
        for call_id, n in answers.items()
        if n == 0
    )
    return out


def _check_reasoning_order(
    items: Sequence[Any], start: int, required: Mapping[str, RequiredReasoning]
) -> list[str]:
    """Served reasoning->function_call pairs must be replayed together (see module doc)."""
    out: list[str] = []
    for idx in range(start, len(items)):
        item = items[idx]
        if not _is_type(item, "function_call"):
            continue
        call_id = item.get("call_id")
        req = required.get(call_id) if isinstance(call_id, str) else None
        if req is None:
            continue
        found: dict[str, Any] | None = None
        j = idx - 1
        while j >= 0 and _is_type(items[j], "reasoning"):
            if items[j].get("id") == req.reasoning_id:
                found = items[j]
                break
            j -= 1
        fc_id = item.get("id") if isinstance(item.get("id"), str) else req.function_call_item_id
        if found is None:
            out.append(
                f"Item '{fc_id}' of type 'function_call' was provided without its required "
                f"'reasoning' item: '{req.reasoning_id}'."
            )
        elif (
            req.encrypted_content is not None
            and found.get("encrypted_content") != req.encrypted_content
        ):
            out.append(
                f"The encrypted content for item {req.reasoning_id} could not be verified: "
                "it must be sent back exactly as it was received."
            )
    return out


def validate_responses_request(
    body: object,
    *,
    required_reasoning: Mapping[str, RequiredReasoning] | None = None,
    previous_responses: Mapping[str, Sequence[Any]] | None = None,
) -> list[str]:
    """Check a ``POST /v1/responses`` body; return violations (empty if valid).

    ``required_reasoning`` maps ``call_id`` to the reasoning item that must precede that call
    (build it with :func:`reasoning_requirements` over every served ``output``).
    ``previous_responses`` maps served response ids to their whole conversation (see
    :func:`conversation_after`); a ``previous_response_id`` not in it is a violation, as in the
    real API.
    """
    if not isinstance(body, dict):
        return [f"Invalid body: expected a JSON object, but got {_json_type(body)} instead."]
    out = _check_model(body)
    out += _check_responses_tools(body)
    out += _check_tool_choice(body)

    prior: list[Any] = []
    prev_id = body.get("previous_response_id")
    if prev_id is not None:
        known = previous_responses or {}
        if isinstance(prev_id, str) and prev_id in known:
            prior = list(known[prev_id])
        else:
            out.append(f"Previous response with id '{prev_id}' not found.")

    inp = body.get("input")
    if inp is not None and not isinstance(inp, str | list):
        out.append(_invalid_type("input", "one of a string or an array of input items", inp))
    items = _input_items(body)
    if isinstance(inp, list):
        for i, item in enumerate(items):
            out += _check_responses_item(item, f"input[{i}]")
    out += _check_duplicate_ids(items)
    context = prior + items
    out += _check_call_pairing(context)
    out += _check_reasoning_order(context, len(prior), required_reasoning or {})
    return out


# --------------------------------------------------------------------------------------------
# Chat Completions API


def _check_chat_tools(body: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for p, tool in _tool_objects(body, out):
        if tool.get("type") != "function":
            continue  # custom tools have shapes of their own
        fn = tool.get("function")
        if not isinstance(fn, dict):
            out.append(_missing(f"{p}.function"))
            continue
        out.extend(_check_nonempty_string(fn, "name", f"{p}.function.name"))
    return out


def _check_tool_calls(msg: Mapping[str, Any], p: str) -> tuple[list[str], list[str]]:
    """Validate an assistant message's ``tool_calls``; return (violations, call ids)."""
    calls = msg["tool_calls"]
    if not isinstance(calls, list):
        return [_invalid_type(f"{p}.tool_calls", "an array", calls)], []
    if not calls:
        return [_empty_array(f"{p}.tool_calls")], []
    out: list[str] = []
    ids: list[str] = []
    for k, call in enumerate(calls):
        cp = f"{p}.tool_calls[{k}]"
        if not isinstance(call, dict):
            out.append(_invalid_type(cp, "an object", call))
            continue
        id_problems = _check_nonempty_string(call, "id", f"{cp}.id")
        out.extend(id_problems)
        if not id_problems:
            if call["id"] in ids:
                out.append(f"Duplicate tool call id '{call['id']}' in '{p}.tool_calls'.")
            else:
                ids.append(call["id"])
        if "type" not in call:
            out.append(_missing(f"{cp}.type"))
        elif call["type"] != "function":
            out.append(_invalid_value(f"{cp}.type", call["type"], ("function",)))
        fn = call.get("function")
        if not isinstance(fn, dict):
            out.append(_missing(f"{cp}.function"))
            continue
        out.extend(_check_nonempty_string(fn, "name", f"{cp}.function.name"))
        if "arguments" not in fn:
            out.append(_missing(f"{cp}.function.arguments"))
        elif not isinstance(fn["arguments"], str):
            out.append(_invalid_type(f"{cp}.function.arguments", "a string", fn["arguments"]))
    return out, ids


def _check_tool_message(msg: Mapping[str, Any], p: str) -> list[str]:
    out: list[str] = []
    tcid = msg.get("tool_call_id")
    if not isinstance(tcid, str) or not tcid:
        out.append(_missing(f"{p}.tool_call_id"))
    if "content" not in msg or msg["content"] is None:
        out.append(_missing(f"{p}.content"))
    else:
        content = msg["content"]
        parts_ok = isinstance(content, list) and all(
            _is_type(part, "text") and isinstance(part.get("text"), str) for part in content
        )
        if not (isinstance(content, str) or parts_ok):
            out.append(
                _invalid_type(
                    f"{p}.content", "one of a string or array of text content parts", content
                )
            )
    return out


_ORPHAN_TOOL_MESSAGE = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
    "message with 'tool_calls'."
)  # sic: the real API spells it "preceeding"


def _check_chat_sequence(messages: Sequence[Any]) -> list[str]:
    out: list[str] = []
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        role = msg.get("role") if isinstance(msg, dict) else None
        if role == "tool":
            out += _check_tool_message(msg, f"messages[{i}]")
            out.append(f"{_ORPHAN_TOOL_MESSAGE} (messages[{i}])")
            i += 1
            continue
        if role != "assistant" or msg.get("tool_calls") is None:
            i += 1
            continue
        problems, ids = _check_tool_calls(msg, f"messages[{i}]")
        out += problems
        answered: set[str] = set()
        j = i + 1
        while j < n and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
            tool_msg = messages[j]
            out += _check_tool_message(tool_msg, f"messages[{j}]")
            tcid = tool_msg.get("tool_call_id")
            if isinstance(tcid, str) and tcid:
                if tcid not in ids:
                    out.append(
                        f"Invalid parameter: 'tool_call_id' of '{tcid}' not found in "
                        "'tool_calls' of previous message."
                    )
                elif tcid in answered:
                    out.append(
                        f"Duplicate tool message for tool_call_id '{tcid}' (messages[{j}]): "
                        "each tool call must be answered exactly once."
                    )
                answered.add(tcid)
            j += 1
        missing = [call_id for call_id in ids if call_id not in answered]
        if missing:
            out.append(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(missing)}"
            )
        i = j
    return out


def validate_chat_request(body: object) -> list[str]:
    """Check a ``POST /v1/chat/completions`` body; return violations (empty if valid)."""
    if not isinstance(body, dict):
        return [f"Invalid body: expected a JSON object, but got {_json_type(body)} instead."]
    out = _check_model(body)
    out += _check_chat_tools(body)
    out += _check_tool_choice(body)
    if "messages" not in body or body["messages"] is None:
        return [*out, _missing("messages")]
    messages = body["messages"]
    if not isinstance(messages, list):
        return [*out, _invalid_type("messages", "an array", messages)]
    if not messages:
        return [*out, _empty_array("messages")]
    for i, msg in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(msg, dict):
            out.append(_invalid_type(p, "an object", msg))
        elif "role" not in msg:
            out.append(_missing(f"{p}.role"))
        elif msg["role"] not in CHAT_ROLES:
            out.append(_invalid_value(f"{p}.role", msg["role"], CHAT_ROLES))
    out += _check_chat_sequence(messages)
    return out
