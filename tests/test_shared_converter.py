"""The payload converter a worker builds for each workflow run shares its converters and
type adapters with every other run (boundloop.codec.SharedPayloadConverter): the same
payload bytes as pydantic's own converter, one adapter a process for boundloop's types,
and none kept for a class a sandbox re-imported for one run."""

from __future__ import annotations

import gc
import types
import weakref

from pydantic import BaseModel
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter

from boundloop.codec import (
    SharedPayloadConverter,
    _process_wide,
    data_converter,
)
from boundloop.contracts import Decision, RunInput, run_input
from boundloop.core.limits import Limits, RunSettings
from boundloop.core.turn import Turn
from boundloop.worker.plugin import keep_codec


def _input() -> RunInput:
    return run_input("Open a restock ticket.", instructions=None, tools=["create_ticket"],
                     settings=RunSettings(model="m", api="responses", limits=Limits()))


def _adapter_cache() -> object:
    converter = SharedPayloadConverter()
    return converter.converters[b"json/plain"]._shared._type_adapter  # type: ignore[attr-defined]


def test_payloads_are_the_bytes_pydantics_converter_writes_and_reads() -> None:
    inp = _input()
    ours, theirs = SharedPayloadConverter(), pydantic_data_converter.payload_converter
    [a], [b] = ours.to_payloads([inp]), theirs.to_payloads([inp])
    assert a == b
    assert ours.from_payloads([b], [RunInput]) == [inp]
    assert ours.from_payloads(theirs.to_payloads([None, 3, "x"])) == [None, 3, "x"]


def test_two_runs_converters_share_one_adapter_for_boundloop_types() -> None:
    first, second = SharedPayloadConverter(), SharedPayloadConverter()
    payload = first.to_payloads([Decision(call_id="c1", approve=True)])[0]
    first.from_payloads([payload], [Decision])
    cache = _adapter_cache()
    hits = cache.cache_info().hits  # type: ignore[attr-defined]
    assert second.from_payloads([payload], [Decision]) == [Decision(call_id="c1",
                                                                    approve=True)]
    assert cache.cache_info().hits == hits + 1  # type: ignore[attr-defined]
    assert all(_process_wide(h) for h in (RunInput, Turn, list[Turn], int | None, None,
                                          dict[str, list[int]], tuple[int, ...]))


def test_a_class_a_sandbox_reimported_is_cached_by_its_run_only() -> None:
    # A copy of a module made for one run: its class is not the one the process's
    # module table holds, so the process-wide cache must not keep it (nor its run).
    module = types.ModuleType(__name__)
    exec("from pydantic import BaseModel\nclass Copy(BaseModel):\n    n: int\n",
         module.__dict__)
    copy: type[BaseModel] = module.Copy
    copy.__module__ = __name__
    assert not _process_wide(copy) and not _process_wide(list[copy])  # type: ignore[valid-type]
    run = SharedPayloadConverter()
    payload = run.to_payloads([copy(n=1)])[0]
    assert run.from_payloads([payload], [copy])[0].n == 1
    gone = weakref.ref(copy)
    del run, copy, module, payload
    gc.collect()
    assert gone() is None  # dropped with the run's converter


def test_workers_and_clients_get_the_shared_converter_keeping_codec_and_options() -> None:
    assert data_converter(None).payload_converter_class is SharedPayloadConverter
    assert keep_codec(pydantic_data_converter).payload_converter_class \
        is SharedPayloadConverter
    assert keep_codec(None).payload_converter_class is SharedPayloadConverter
    kept = data_converter(None)
    assert keep_codec(kept) is kept

    class Own(PydanticPayloadConverter):  # a caller's own options stay theirs
        pass

    own = DataConverter(payload_converter_class=Own)
    assert keep_codec(own) is own
