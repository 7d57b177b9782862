"""Message contracts and their encoding: what producers and consumers agree on."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from pydantic import ValidationError
from switchyard.bus import codec
from switchyard.bus.partitioner import murmur2, partition_for_key
from switchyard.bus.records import Envelope
from switchyard.contracts import (
    ALL_TOPICS,
    ClassificationPayload,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    RequestTimeline,
    StagePayload,
)
from switchyard.contracts.topics import (
    CLASSIFICATION_REQUESTS,
    REQUESTS,
    STAGE_REQUESTS,
    requests_topic,
)
from switchyard.errors import DecodeError


def _request(**changes: object) -> InferenceRequest:
    fields: dict[str, object] = {
        "request_id": "r-1",
        "app": "chat",
        "payload": LLMPayload(model="llama-7b", prompt_tokens=512, max_output_tokens=128),
        "arrival_s": 1_700_000_000.0,
    }
    fields.update(changes)
    return InferenceRequest.model_validate(fields)


def _envelope(value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Envelope:
    return Envelope("switchyard.requests", 0, 7, b"r-1", value, headers, 0)


def test_every_message_carries_version_id_and_creation_time() -> None:
    before = time.time()
    request = _request()
    assert request.schema_version == 1
    assert len(request.message_id) == 32
    assert before <= request.created_at_s <= time.time()
    assert _request().message_id != request.message_id


def test_topics_have_unique_names_and_each_message_type_one_topic() -> None:
    names = [t.name for t in ALL_TOPICS]
    assert len(set(names)) == len(names)
    # Requests travel on one topic per kind; every other message type on one topic.
    types = [m.MESSAGE_TYPE for t in ALL_TOPICS for m in t.message_types]
    assert Counter(types) == dict.fromkeys(types, 1) | {"inference-request": 3}


def test_a_request_goes_to_the_topic_of_its_kind() -> None:
    llm = _request()
    classification = llm.model_copy(update={"payload": ClassificationPayload(features=[1.0])})
    assert requests_topic(llm) is REQUESTS
    assert requests_topic(classification) is CLASSIFICATION_REQUESTS
    stage = llm.model_copy(
        update={"payload": StagePayload(pipeline="txt2img", stage="encode", model="m")}
    )
    assert requests_topic(stage) is STAGE_REQUESTS


def test_encode_then_decode_is_identity_with_describing_headers() -> None:
    request = _request(deadline_s=1_700_000_002.5, priority=3)
    value, headers = codec.encode(request)
    assert dict(headers)["sy-type"] == b"inference-request"
    assert codec.decode(_envelope(value, tuple(headers)), InferenceRequest) == request


def test_unknown_fields_from_a_newer_producer_are_ignored() -> None:
    body = json.loads(_request().model_dump_json())
    body["added_later"] = {"anything": 1}
    decoded = codec.decode(_envelope(json.dumps(body).encode()), InferenceRequest)
    assert decoded.request_id == "r-1"


@pytest.mark.parametrize(
    ("value", "headers", "kind", "says"),
    [
        (b"\x00\x01binary", (), "bad_bytes", "JSON"),
        (b"[1, 2]", (), "validation", "inference-request"),
        (b'{"schema_version": 9}', (), "schema_version", "version 9"),
        (b"{}", (("sy-type", b"heartbeat"),), "message_type", "heartbeat"),
    ],
)
def test_decode_failures_name_their_reason(
    value: bytes, headers: tuple[tuple[str, bytes], ...], kind: str, says: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode(_envelope(value, headers), InferenceRequest)
    assert caught.value.kind == kind
    assert says in str(caught.value)
    assert not caught.value.retriable


def test_validation_reason_lists_the_fields_at_fault() -> None:
    body = json.loads(_request().model_dump_json())
    body["payload"]["prompt_tokens"] = -5
    del body["app"]
    with pytest.raises(DecodeError) as caught:
        codec.decode(_envelope(json.dumps(body).encode()), InferenceRequest)
    assert "app: Field required" in str(caught.value)
    assert "payload.llm.prompt_tokens" in str(caught.value)


def test_a_deadline_before_arrival_is_rejected() -> None:
    with pytest.raises(ValidationError, match="deadline_s is before arrival_s"):
        _request(deadline_s=1_600_000_000.0)


def test_identifiers_refuse_spaces_and_control_characters() -> None:
    with pytest.raises(ValidationError, match="request_id"):
        _request(request_id="r 1\n")


def test_completion_timeline_gives_the_latency_breakdown() -> None:
    timeline = RequestTimeline(arrival_s=10.0, assigned_s=10.25, started_s=11.0, finished_s=13.5)
    completion = Completion(
        request_id="r-1",
        app="chat",
        worker_id="w-1",
        worker_type="a100",
        variant="llama-7b",
        status=CompletionStatus.OK,
        timeline=timeline,
    )
    assert completion.timeline.scheduling_s() == pytest.approx(0.25)
    assert completion.timeline.queueing_s() == pytest.approx(0.75)
    assert completion.timeline.execution_s() == pytest.approx(2.5)
    assert RequestTimeline(arrival_s=1.0).queueing_s() is None


@pytest.mark.parametrize(
    ("key", "java_signed_hash"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafkas_java_partitioner(key: bytes, java_signed_hash: int) -> None:
    unsigned = java_signed_hash & 0xFFFFFFFF
    assert murmur2(key) == unsigned
    assert partition_for_key(key, 4) == (unsigned & 0x7FFFFFFF) % 4
