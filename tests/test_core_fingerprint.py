"""Fingerprints (tool name + canonical JSON of the arguments) and byte-bounded previews.

A fingerprint identifies a call whatever the key order, whitespace or unicode
escaping the model used; different arguments or tools never share one.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from boundloop.core.canonical import preview, utf8_len
from boundloop.core.fingerprint import fingerprint
from tests.support import strategies

FP = re.compile(r"^(?P<tool>.+):(?P<hash>[0-9a-f]{16})$", re.DOTALL)

tool_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=24)

# JSON values whose Python equality is JSON equality: no floats (1 == 1.0) and no
# booleans (True == 1), so `a != b` means the model wrote different arguments.
scalars = st.none() | st.integers(-(10**12), 10**12) | st.text(max_size=20)
json_values = strategies.json_values(scalars, leaves=8)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=6)

# Wider values for invariance checks (floats and booleans are fine there).
any_json = strategies.json_values(leaves=15)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: shuffled(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@settings(max_examples=150, deadline=None)
@given(tool=tool_names, args=st.dictionaries(st.text(max_size=10), any_json, max_size=6),
       seed=st.integers(0, 2**32 - 1))
def test_fingerprint_ignores_key_order(tool: str, args: dict[str, Any], seed: int) -> None:
    other = shuffled(args, random.Random(seed))
    assert fingerprint(tool, other) == fingerprint(tool, args)


@settings(max_examples=150, deadline=None)
@given(tool=tool_names, args=st.dictionaries(st.text(max_size=10), any_json, max_size=6),
       indent=st.one_of(st.none(), st.integers(0, 4), st.sampled_from(["\t", "  \n "])),
       item_sep=st.sampled_from([",", ", ", " , ", ",\n"]),
       key_sep=st.sampled_from([":", ": ", " : ", ":\t"]))
def test_fingerprint_ignores_whitespace_of_the_json_text(
        tool: str, args: dict[str, Any], indent: int | str | None, item_sep: str,
        key_sep: str) -> None:
    compact = json.dumps(args, separators=(",", ":"))
    spaced = json.dumps(args, indent=indent, separators=(item_sep, key_sep))
    padded = "\n  " + spaced + " \t\n"
    assert fingerprint(tool, json.loads(padded)) == fingerprint(tool, json.loads(compact))


@settings(max_examples=150, deadline=None)
@given(tool=tool_names, args=st.dictionaries(st.text(max_size=10), any_json, max_size=6))
def test_fingerprint_ignores_unicode_escaping(tool: str, args: dict[str, Any]) -> None:
    escaped = json.dumps(args, ensure_ascii=True)     # "\u5317\u4eac", surrogate pairs
    literal = json.dumps(args, ensure_ascii=False)    # "北京"
    assert fingerprint(tool, json.loads(escaped)) == fingerprint(tool, json.loads(literal))


def test_escaped_and_literal_city_names_share_a_fingerprint() -> None:
    escaped = json.loads('{"city": "\\u5317\\u4eac", "emoji": "\\ud83d\\ude00"}')
    literal = json.loads('{"emoji": "😀", "city": "北京"}')
    spaced = json.loads('{ "city" :  "北京" ,\n "emoji":"😀" }')
    assert fingerprint("weather", escaped) == fingerprint("weather", literal)
    assert fingerprint("weather", spaced) == fingerprint("weather", literal)


@settings(max_examples=60, deadline=None)
@given(tool=tool_names, a=arguments, b=arguments)
def test_different_arguments_give_different_fingerprints(
        tool: str, a: dict[str, Any], b: dict[str, Any]) -> None:
    assume(a != b)
    assert fingerprint(tool, a) != fingerprint(tool, b)


@settings(max_examples=100, deadline=None)
@given(tool=tool_names, args=arguments, data=st.data())
def test_changing_one_argument_value_changes_the_fingerprint(
        tool: str, args: dict[str, Any], data: st.DataObject) -> None:
    key = data.draw(st.text(max_size=10), label="key")
    value = data.draw(json_values, label="value")
    changed = {**args, key: value}
    assume(changed != args)
    assert fingerprint(tool, changed) != fingerprint(tool, args)


@settings(max_examples=100, deadline=None)
@given(tool=tool_names, items=st.lists(st.integers(), min_size=2, max_size=5, unique=True))
def test_list_order_is_part_of_the_fingerprint(tool: str, items: list[int]) -> None:
    assert fingerprint(tool, {"ids": items}) != fingerprint(tool, {"ids": items[::-1]})


def test_value_types_are_part_of_the_fingerprint() -> None:
    assert fingerprint("t", {"n": 1}) != fingerprint("t", {"n": "1"})
    assert fingerprint("t", {"n": 1}) != fingerprint("t", {"n": True})
    assert fingerprint("t", {"n": None}) != fingerprint("t", {})


@settings(max_examples=60, deadline=None)
@given(a=tool_names, b=tool_names, args=arguments)
def test_different_tool_names_give_different_fingerprints(
        a: str, b: str, args: dict[str, Any]) -> None:
    assume(a != b)
    assert fingerprint(a, args) != fingerprint(b, args)


@settings(max_examples=100, deadline=None)
@given(tool=tool_names, args=arguments)
def test_fingerprint_is_tool_name_and_short_hash_without_the_arguments(
        tool: str, args: dict[str, Any]) -> None:
    fp = fingerprint(tool, args)
    match = FP.match(fp)
    assert match is not None, fp
    assert match["tool"] == tool
    assert fingerprint(tool, args) == fp  # deterministic: no clock, no random


def test_fingerprint_does_not_carry_the_argument_values() -> None:
    secret = "hunter2-password"
    fp = fingerprint("login", {"password": secret})
    assert secret not in fp
    assert fp.startswith("login:")


# --- preview: byte-bounded, never splits a code point --------------------------------

@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), max_bytes=st.integers(3, 300))
def test_preview_never_exceeds_its_byte_bound(text: str, max_bytes: int) -> None:
    assert utf8_len(preview(text, max_bytes)) <= max_bytes


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), max_bytes=st.integers(3, 300))
def test_preview_is_always_valid_utf8_and_a_prefix_of_the_text(
        text: str, max_bytes: int) -> None:
    out = preview(text, max_bytes)
    raw = out.encode("utf-8")  # raises on a split surrogate pair or lone surrogate
    assert raw.decode("utf-8") == out
    if out == text:
        assert utf8_len(text) <= max_bytes
    else:
        assert out.endswith("…")
        assert text.startswith(out[:-1])


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=100))
def test_preview_returns_text_that_fits_unchanged(text: str) -> None:
    assert preview(text, utf8_len(text)) == text


def test_preview_cuts_japanese_text_on_character_boundaries() -> None:
    text = "在庫を調べて" * 10           # 3 bytes a character
    out = preview(text, 10)             # 7 bytes of text + 3 for "…": two characters fit
    assert out == "在庫…"
    assert utf8_len(out) <= 10
    four_byte = "😀" * 5
    assert preview(four_byte, 9) == "😀…"  # 4 + 3 bytes; a second emoji would not fit


def test_preview_of_a_default_call_fits_80_bytes() -> None:
    out = preview("あ" * 1000)
    assert utf8_len(out) <= 80
    assert out.endswith("…")


def test_preview_respects_bounds_smaller_than_the_ellipsis() -> None:
    # The docstring promises "at most max_bytes"; the ellipsis counts inside the bound.
    for max_bytes in (0, 1, 2):
        assert utf8_len(preview("abcdef", max_bytes)) <= max_bytes
