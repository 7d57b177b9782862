"""The OpenAPI 3.1 document of the ingress API (``GET /openapi.json``).

Request bodies come from the pydantic models that validate them
(:mod:`services.ingress.openai_schema`), so the document cannot drift from what is
checked; the response shapes are written out here, next to nothing else.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from switchyard.serving import ServingCatalogue

from services.ingress.drain import HEALTH_PATHS
from services.ingress.openai_schema import ChatBody, CompletionBody, InferBody
from services.ingress.pipeline_body import PipelineBody

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_NUMBER = {"type": "number"}
_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_BOOLEAN = {"type": "boolean"}

_TIMELINE = {
    "type": "object",
    "description": "When each step happened, epoch seconds (null: it did not happen).",
    "properties": {
        name: _nullable(_NUMBER)
        for name in ("arrival_s", "assigned_s", "started_s", "first_token_s", "finished_s")
    },
}

_SWITCHYARD_BLOCK = {
    "type": "object",
    "description": "Where and how the request was served. emulated: the latency is a "
    "performance model's output, not a measurement (header X-Switchyard-Emulated: true). "
    "LLM answers: ttft_s and tpot_s (time to the first token, per output token after it) "
    "and token_slo_met (both within the application's objectives).",
    "properties": {
        "request_id": _STRING,
        "status": {"type": "string", "enum": ["ok", "failed", "expired", "cancelled"]},
        "worker_id": _STRING,
        "worker_type": _STRING,
        "variant": _STRING,
        "emulated": _BOOLEAN,
        "deadline_s": _nullable(_NUMBER),
        "deadline_met": _BOOLEAN,
        "timeline": _ref("Timeline"),
        "ttft_s": _nullable(_NUMBER),
        "tpot_s": _nullable(_NUMBER),
        "token_slo_met": _nullable(_BOOLEAN),
    },
}

_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": _INTEGER,
        "completion_tokens": _INTEGER,
        "total_tokens": _INTEGER,
    },
}

_COMPLETION = {
    "type": "object",
    "description": "object is text_completion (choices[0].text) or chat.completion "
    "(choices[0].message). A stream sends chunks (text_completion or "
    "chat.completion.chunk with choices[0].text / choices[0].delta.content), then a "
    "final chunk with finish_reason and switchyard, then (with stream_options."
    "include_usage) a chunk with no choices and the usage, then data: [DONE].",
    "properties": {
        "id": _STRING,
        "object": {"type": "string", "enum": ["text_completion", "chat.completion"]},
        "created": _INTEGER,
        "model": _STRING,
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": _INTEGER,
                    "text": _STRING,
                    "message": {
                        "type": "object",
                        "properties": {"role": {"const": "assistant"}, "content": _STRING},
                    },
                    "finish_reason": {"type": "string", "enum": ["length"]},
                },
            },
        },
        "usage": _ref("Usage"),
        "switchyard": _ref("SwitchyardBlock"),
    },
}

_CLASSIFICATION = {
    "type": "object",
    "properties": {
        "request_id": _STRING,
        "app": _STRING,
        "status": _STRING,
        "label": _nullable(_INTEGER),
        "class_name": _nullable(_STRING),
        "probabilities": {"type": "array", "items": _NUMBER},
        "variant": _STRING,
        "worker_id": _STRING,
        "worker_type": _STRING,
        "emulated": _BOOLEAN,
        "deadline_s": _nullable(_NUMBER),
        "deadline_met": _BOOLEAN,
        "timeline": _ref("Timeline"),
    },
}

_PIPELINE_STAGE = {
    "type": "object",
    "description": "One stage of a pipeline call: who served it, how, and when (epoch "
    "seconds; latency_s from the stage's arrival to its finish, execution_s from its start "
    "to its finish). Its request id is the call's id, a dot and the stage's name.",
    "properties": {
        "stage": _STRING,
        "model": _STRING,
        "request_id": _STRING,
        "status": {"type": "string", "enum": ["ok", "failed", "expired", "cancelled"]},
        "worker_id": _STRING,
        "worker_type": _STRING,
        "emulated": _BOOLEAN,
        **{
            name: _nullable(_NUMBER)
            for name in (
                "arrival_s",
                "assigned_s",
                "started_s",
                "finished_s",
                "latency_s",
                "execution_s",
            )
        },
    },
    "required": ["stage", "model", "request_id", "status", "worker_id"],
}

_PIPELINE_ANSWER = {
    "type": "object",
    "description": "A pipeline call's answer once every stage finished ok. output: the "
    "outputs of the stages nothing runs after, by stage name. latency_s: from the call's "
    "arrival to its last stage's finish; slo_s: the pipeline's SLO as the call is judged "
    "by (the catalogue's model seconds over SWITCHYARD_WORKER_TIME_SCALE), both wall "
    "seconds; met_slo: the last stage finished by deadline_s (epoch seconds). emulated: "
    "some stage's latency is a performance model's output (header X-Switchyard-Emulated).",
    "properties": {
        "id": _STRING,
        "object": {"const": "pipeline.result"},
        "created": _INTEGER,
        "app": _STRING,
        "output": {"type": "object", "additionalProperties": _STRING},
        "stages": {"type": "array", "items": _ref("PipelineStage")},
        "latency_s": _NUMBER,
        "slo_s": _NUMBER,
        "deadline_s": _NUMBER,
        "met_slo": _BOOLEAN,
        "emulated": _BOOLEAN,
    },
    "required": ["id", "object", "app", "output", "stages", "latency_s", "slo_s", "met_slo"],
}

_STATUS = {
    "type": "object",
    "properties": {
        "request_id": _STRING,
        "app": _STRING,
        "kind": _nullable(
            {"type": "string", "enum": ["llm", "classification", "stage", "pipeline"]}
        ),
        "status": {
            "type": "string",
            "enum": ["queued", "assigned", "running", "ok", "failed", "expired", "cancelled"],
        },
        "deadline_s": _nullable(_NUMBER),
        "deadline_met": _BOOLEAN,
        "worker_id": _nullable(_STRING),
        "worker_type": _STRING,
        "variant": _STRING,
        "emulated": _BOOLEAN,
        "result": _nullable({"type": "object"}),
        "error": _nullable(_STRING),
        "timeline": _ref("Timeline"),
        "stages": {
            "type": "array",
            "description": "A pipeline call's stages, in pipeline order.",
            "items": {
                "type": "object",
                "properties": {
                    "stage": _STRING,
                    "model": _STRING,
                    "request_id": _STRING,
                    "status": _nullable(_STRING),
                    "worker_id": _nullable(_STRING),
                },
            },
        },
        "output": {
            "type": "object",
            "description": "A pipeline call's answer, once every stage is ok: the outputs of "
            "the stages nothing runs after, by stage name.",
        },
    },
    "required": ["request_id", "app", "status"],
}

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": _STRING,
                "type": _STRING,
                "param": _nullable(_STRING),
                "code": _nullable(_STRING),
            },
            "required": ["message", "type", "param", "code"],
        },
        "switchyard": {"type": "object"},
    },
    "required": ["error"],
}

_MODEL = {
    "type": "object",
    "properties": {
        "id": _STRING,
        "object": {"const": "model"},
        "created": _INTEGER,
        "owned_by": _STRING,
        "switchyard": {"type": "object"},
    },
}

_MODEL_LIST = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": _ref("Model")},
    },
}

_APP_LIST = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": _STRING,
                    "feature_dim": _INTEGER,
                    "classes": {"type": "array", "items": _STRING},
                    "deadline_ms": _NUMBER,
                    "variants": {"type": "array", "items": _STRING},
                },
            },
        },
        "pipelines": {
            "type": "array",
            "description": "The pipeline applications: slo_s in model seconds, deadline_ms "
            "the wall-clock deadline a call gets; stages in order, each with the stages "
            "it runs after.",
            "items": {
                "type": "object",
                "properties": {
                    "name": _STRING,
                    "kind": {"const": "pipeline"},
                    "slo_s": _NUMBER,
                    "deadline_ms": _NUMBER,
                    "models": {"type": "array", "items": _STRING},
                    "stages": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": _STRING,
                                "model": _STRING,
                                "after": {"type": "array", "items": _STRING},
                            },
                        },
                    },
                },
            },
        },
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "description": "A chunk (the Completion's shape with the new text) as JSON, or "
            "[DONE] after the last.",
        },
        "event": _STRING,
        "id": _STRING,
        "retry": {"type": "integer"},
    },
}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "Invalid input; the message and param name the field.",
        401: "No API key, or an unknown one (with SWITCHYARD_AUTH=api-key).",
        404: "Unknown model, application or request.",
        405: "Wrong method.",
        409: "The request_id was used for a different request (a retry must repeat it exactly).",
        413: "Body larger than the configured limit.",
        415: "Content-Type is not JSON.",
        429: "Admission control: no worker can finish it (for a pipeline: its stages) "
        "before its deadline, or the "
        "tenant's rate limit or concurrency quota; see Retry-After and x-ratelimit-*.",
        502: "The worker failed (or cancelled) the request (for a pipeline: one of its "
        "stages; the message names it, its model and the reason).",
        503: "Could not queue the request, or draining; see Retry-After.",
        504: "Expired before being served, or no answer within the answer timeout "
        "(poll GET /v1/requests/{id}).",
    }
    return {str(s): _json(_ref("Error"), text[s]) for s in statuses}


_POST_ERRORS = (400, 401, 404, 405, 409, 413, 415, 429, 502, 503, 504)

_HEADERS = [
    {
        "name": "X-Switchyard-Deadline-Ms",
        "in": "header",
        "required": False,
        "description": "Relative deadline in ms (> 0); the body's value wins.",
        "schema": {"type": "number", "exclusiveMinimum": 0},
    },
    {
        "name": "X-Switchyard-Priority",
        "in": "header",
        "required": False,
        "description": "Priority 0..1000; the body's value wins.",
        "schema": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
]


def _body_schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return _ref(model.__name__)


def openapi_document(catalogue: ServingCatalogue) -> dict[str, Any]:
    """The OpenAPI 3.1 document; the served model and application names are listed in
    the descriptions."""
    components: dict[str, Any] = {
        "Timeline": _TIMELINE,
        "SwitchyardBlock": _SWITCHYARD_BLOCK,
        "Usage": _USAGE,
        "Completion": _COMPLETION,
        "ClassificationAnswer": _CLASSIFICATION,
        "PipelineStage": _PIPELINE_STAGE,
        "PipelineAnswer": _PIPELINE_ANSWER,
        "RequestStatus": _STATUS,
        "Error": _ERROR,
        "Model": _MODEL,
        "ModelList": _MODEL_LIST,
        "AppList": _APP_LIST,
    }
    models = ", ".join(sorted(catalogue.llm)) or "none"
    apps = ", ".join(sorted(catalogue.classification)) or "none"
    pipelines = ", ".join(sorted(catalogue.pipelines)) or "none"
    completion_body = _body_schema(CompletionBody, components)
    chat_body = _body_schema(ChatBody, components)
    infer_body = _body_schema(InferBody, components)
    pipeline_body = _body_schema(PipelineBody, components)
    # The served names, so that a client (or a fuzzer) knows them; another gets 404.
    for body in ("CompletionBody", "ChatBody"):
        components[body]["properties"]["model"]["enum"] = sorted(catalogue.llm)
    answer_ok = {
        "description": "The answer (or, with stream=true, text/event-stream chunks).",
        "headers": {
            "X-Switchyard-Emulated": {
                "description": "true when the latency is a performance model's output",
                "schema": _STRING,
            },
            "X-Switchyard-Request-Id": {"schema": _STRING},
        },
        "content": {
            "application/json": {"schema": _ref("Completion")},
            # One server-sent event: a chunk of the answer as JSON, "[DONE]" the last.
            "text/event-stream": {"schema": _SSE_EVENT},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard ingress",
            "version": "1",
            "description": "OpenAI-compatible completions and classification inference, "
            "scheduled by Switchyard.",
        },
        "paths": {
            "/v1/completions": {
                "post": {
                    "summary": f"Text completion. Served models: {models}.",
                    "parameters": _HEADERS,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": completion_body}},
                    },
                    "responses": {"200": answer_ok, **_errors(*_POST_ERRORS)},
                }
            },
            "/v1/chat/completions": {
                "post": {
                    "summary": f"Chat completion. Served models: {models}. The prompt is one "
                    "'role: content' line per message, then 'assistant:'.",
                    "parameters": _HEADERS,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": chat_body}},
                    },
                    "responses": {"200": answer_ok, **_errors(*_POST_ERRORS)},
                }
            },
            "/v1/apps/{app}/infer": {
                "post": {
                    "summary": f"Classify one feature vector (InferBody; classification "
                    f"applications: {apps}), or run a pipeline of model stages on one input "
                    f"(PipelineBody, which takes no other field; pipelines: {pipelines}). "
                    "A pipeline's stages each become a request '{id}.{stage}' "
                    "(GET /v1/requests/{id}.{stage}; GET /v1/requests/{id} reads the whole "
                    "call back from them); a retry with the same request_id runs "
                    "no stage twice. The deadline and priority headers apply to "
                    "classification only.",
                    "parameters": [
                        {
                            "name": "app",
                            "in": "path",
                            "required": True,
                            "schema": {
                                "type": "string",
                                "enum": sorted({*catalogue.classification, *catalogue.pipelines}),
                            },
                        },
                        *_HEADERS,
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"anyOf": [infer_body, pipeline_body]}}
                        },
                    },
                    "responses": {
                        "200": _json(
                            {"anyOf": [_ref("ClassificationAnswer"), _ref("PipelineAnswer")]},
                            "The label (a classification application) or the pipeline's "
                            "outputs (a pipeline).",
                        ),
                        **_errors(*_POST_ERRORS),
                    },
                }
            },
            "/v1/requests/{request_id}": {
                "get": {
                    "summary": "A request's status and result, from any replica; for a "
                    "pipeline call's id, the call's status (kind 'pipeline') put together "
                    "from its stages' records, with each stage's status and, once every "
                    "stage is ok, the call's output.",
                    "parameters": [
                        {"name": "request_id", "in": "path", "required": True, "schema": _STRING}
                    ],
                    "responses": {
                        "200": _json(_ref("RequestStatus"), "The request's record."),
                        **_errors(401, 404, 503),
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "The LLM applications (OpenAI model list).",
                    "responses": {"200": _json(_ref("ModelList"), "The models."), **_errors(401)},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One LLM application (OpenAI model object).",
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": _STRING}
                    ],
                    "responses": {
                        "200": _json(_ref("Model"), "The model."),
                        **_errors(401, 404),
                    },
                }
            },
            "/v1/apps": {
                "get": {
                    "summary": "The classification applications and the pipelines.",
                    "responses": {
                        "200": _json(_ref("AppList"), "The applications."),
                        **_errors(401),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document.",
                    "security": [],
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1.")},
                }
            },
            **{
                path: {
                    "get": {
                        "summary": "200 while serving, 503 while draining.",
                        "security": [],
                        "responses": {
                            "200": _json({"type": "object"}, "Serving."),
                            "503": _json({"type": "object"}, "Draining."),
                        },
                    }
                }
                for path in HEALTH_PATHS
            },
        },
        # Calls under /v1/ need it when the ingress runs with SWITCHYARD_AUTH=api-key.
        "security": [{"apiKey": []}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant's API key (`switchyard keys new TENANT`).",
                }
            },
        },
    }
