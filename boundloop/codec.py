"""Payload encryption: a Temporal `PayloadCodec` with AES-256-GCM keys by id.

Every payload the client or a worker sends to Temporal (run input, activity arguments
and results, the RunResult, update and query payloads) is encrypted before it leaves
the process; the server, its database and `temporal workflow show` hold only
ciphertext. Search attributes (status, counters) and failure messages stay readable:
they are boundloop's own words, never a prompt, argument or tool output.

Keys: `id:base64key` lines (a 32-byte key, `boundloop codec-key new ID` makes one),
from a file (BOUNDLOOP_CODEC_KEYS) or the environment (BOUNDLOOP_CODEC_KEY). The last
line is the newest key: it encrypts every new payload; every key decrypts (rotation:
append a new key, keep the old ones while any history holds payloads they encrypted).

Decoding a payload encrypted under a key id this process lacks raises `CodecKeyError`
with a message naming the id: in a worker the workflow task fails with that message
and is retried by Temporal, so the run continues once the key is added and the worker
restarted; nothing is lost.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

from boundloop.errors import BoundloopError
from boundloop.secret_files import shared_problem

#: The `encoding` metadata of an encrypted payload and the metadata key naming its key
#: (the names Temporal's encryption samples use, so other tools recognise them).
ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class CodecKeyError(BoundloopError):
    """A key set that cannot be used, or a payload this process cannot decrypt."""


def new_key_line(key_id: str) -> str:
    """A fresh `id:base64key` line for a key file."""
    if not _ID.match(key_id):
        raise CodecKeyError(f"key id {key_id!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"


def parse_keys(text: str, *, source: str) -> dict[str, bytes]:
    """`id:base64key` lines (blank lines and `#` comments skipped; commas separate
    entries on one line too), oldest first. The message names `source` and the line,
    never a key."""
    keys: dict[str, bytes] = {}
    entries = [(n, e.strip()) for n, line in enumerate(text.splitlines(), 1)
               if not line.lstrip().startswith("#") for e in line.split(",")]
    for number, entry in entries:
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        key_id = key_id.strip()
        where = f"{source} line {number}"
        if not sep or not _ID.match(key_id):
            raise CodecKeyError(f"{where}: expected `id:base64key` (an id of letters, "
                                "digits, '.', '_' or '-'; `boundloop codec-key new ID` "
                                "prints one)")
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise CodecKeyError(f"{where}: key {key_id!r} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise CodecKeyError(f"{where}: key {key_id!r} is {len(key)} bytes; AES-256 "
                                f"needs {KEY_BYTES}")
        if key_id in keys:
            raise CodecKeyError(f"{where}: key id {key_id!r} appears twice")
        keys[key_id] = key
    if not keys:
        raise CodecKeyError(f"{source} holds no key")
    return keys


def load_keys(*, keys_file: Path | None, keys_text: str | None) -> dict[str, bytes] | None:
    """The configured keys (file or environment), or None when encryption is off."""
    if keys_file is not None and keys_text is not None:
        raise CodecKeyError("set BOUNDLOOP_CODEC_KEYS (a key file) or BOUNDLOOP_CODEC_KEY "
                            "(the keys themselves), not both")
    if keys_file is not None:
        try:
            mode = keys_file.stat().st_mode
            text = keys_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise CodecKeyError(f"BOUNDLOOP_CODEC_KEYS: cannot read {keys_file}: "
                                f"{exc.strerror or exc}") from None
        # Refused like an approver's private key: keys others may read may already be
        # someone else's (the image's user is uid 10001: `chown 10001`, not `chmod 644`).
        problem = shared_problem("BOUNDLOOP_CODEC_KEYS", keys_file, mode)
        if problem is not None:
            raise CodecKeyError(problem)
        return parse_keys(text, source=str(keys_file))
    if keys_text is not None:
        return parse_keys(keys_text, source="BOUNDLOOP_CODEC_KEY")
    return None


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM with keys by id; the newest (last) key encrypts, every key decrypts.

    The key id is authenticated with the ciphertext, so a payload moved under another
    id does not decrypt. Payloads without the encrypted encoding pass through: runs
    started before encryption was turned on stay readable.
    """

    def __init__(self, keys: dict[str, bytes], *,
                 source: str = "BOUNDLOOP_CODEC_KEYS") -> None:
        if not keys:
            raise CodecKeyError("an encryption codec needs at least one key")
        self._keys = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.key_ids = list(keys)
        self.current = self.key_ids[-1]
        #: Where the keys came from, named in errors: the setting the operator fixes.
        self.source = source

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        aead, key_id = self._keys[self.current], self.current.encode()
        out = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            sealed = aead.encrypt(nonce, payload.SerializeToString(), key_id)
            out.append(Payload(metadata={"encoding": ENCODING, KEY_ID: key_id},
                               data=nonce + sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        aead = self._keys.get(key_id)
        if aead is None:
            raise CodecKeyError(
                f"a payload is encrypted with key id {key_id!r}, which this process does "
                f"not have (it has {', '.join(self.key_ids)}): add that key to "
                f"{self.source} and restart; keep every key that encrypted a "
                "history still open")
        try:
            plain = aead.decrypt(payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:],
                                 key_id.encode())
        except InvalidTag:
            raise CodecKeyError(
                f"a payload encrypted with key id {key_id!r} does not decrypt with this "
                f"process's key {key_id!r}: {self.source} holds another key under that "
                "id") from None
        return Payload.FromString(plain)


class PlainGuardCodec(PayloadCodec):
    """No encryption configured: payloads pass through, and an encrypted one read back
    fails with a message saying which setting is missing (instead of the SDK's
    "unknown payload encoding")."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCODING:
                key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
                raise CodecKeyError(
                    f"a payload is encrypted (key id {key_id!r}) but this process has no "
                    "codec keys: set BOUNDLOOP_CODEC_KEYS (or BOUNDLOOP_CODEC_KEY) to the "
                    "key file the runs were written with, and restart")
        return list(payloads)


def data_converter(codec: PayloadCodec | None) -> DataConverter:
    """The pydantic data converter boundloop's payloads need, with `codec` (None: the
    pass-through guard)."""
    return dataclasses.replace(pydantic_data_converter, payload_codec=codec or PlainGuardCodec())


async def encrypted_encoding(client: Client) -> bytes | None:
    """The `encoding` the client's codec gives the payloads it encodes (boundloop's
    codec: ENCODING; another codec its own), or None when it leaves them plain."""
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"null")
    codec = client.data_converter.payload_codec
    if codec is None:
        return None
    [probe] = await codec.encode([plain])
    encoding = probe.metadata.get("encoding")
    return None if encoding == plain.metadata["encoding"] else encoding


async def started_encrypted(client: Client, workflow_id: str, run_id: str) -> bool:
    """Whether every payload of a run's input reached Temporal encrypted by `client`'s
    codec, and for a child (a session's turn) every message its parent accepted too.
    Read from the histories as the server stores them: past the data converter, which
    would decode them."""
    encoding = await encrypted_encoding(client)
    if encoding is None:
        return False
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        started = event.workflow_execution_started_event_attributes
        if not _all_encoded(started.input.payloads, encoding):
            return False
        parent = started.parent_workflow_execution
        return not parent.workflow_id or await _messages_encrypted(
            client.get_workflow_handle(parent.workflow_id, run_id=parent.run_id), encoding)
    return False


async def _messages_encrypted(handle: WorkflowHandle[Any, Any], encoding: bytes) -> bool:
    """The workflow's input and every update it accepted (a session's `say`) so far."""
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
        elif event.HasField("workflow_execution_update_accepted_event_attributes"):
            accepted = event.workflow_execution_update_accepted_event_attributes
            payloads = accepted.accepted_request.input.args.payloads
        else:
            continue
        if not _all_encoded(payloads, encoding):
            return False
    return True


def _all_encoded(payloads: Sequence[Payload], encoding: bytes) -> bool:
    return all(p.metadata.get("encoding") == encoding for p in payloads)
