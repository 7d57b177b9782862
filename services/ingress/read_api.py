"""The ingress's reading endpoints: a request's status, the catalogue (``/v1/models``,
``/v1/apps``), the OpenAPI document and ``/healthz``; the calls that start work are in
:mod:`services.ingress.api`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from switchyard.lifecycle import REQUEST_TTL_S, RequestLedger
from switchyard.multimodel.model import Stage
from switchyard.serving import LlmApplication, ServingCatalogue

from services.ingress.answers import AnswerRegistry
from services.ingress.auth import tenant_of
from services.ingress.drain import Admission, unavailable
from services.ingress.errors import NOT_FOUND, ApiError
from services.ingress.openapi import openapi_document
from services.ingress.pipeline_status import pipeline_call_status
from services.ingress.responses import answer_headers, switchyard_block, timeline
from services.ingress.tenants import public_request_id


class ReadApi:
    """The reading route handlers (see the module docstring)."""

    def __init__(
        self,
        catalogue: ServingCatalogue,
        ledger: RequestLedger,
        answers: AnswerRegistry,
        admission: Admission,
        *,
        time_scale: float = 1.0,
    ) -> None:
        self.catalogue = catalogue
        self.ledger = ledger
        self.answers = answers
        self.admission = admission
        self.time_scale = time_scale
        """Emulated workers' speed-up (``SWITCHYARD_WORKER_TIME_SCALE``): a pipeline's
        SLO in model seconds over it is the wall time its calls are judged by."""
        self._openapi: dict[str, Any] | None = None

    async def request_status(self, request: Request) -> Response:
        """``GET /v1/requests/{request_id}``."""
        request_id = request.path_params["request_id"]
        scoped = tenant_of(request.scope).scoped(request_id)
        try:
            # Only the caller's tenant's: another's request with this id is not found.
            record = await self.ledger.read(scoped)
            call = None
            if record is None and self.catalogue.pipelines:
                call = await pipeline_call_status(self.ledger, self.catalogue.pipelines, scoped)
        except Exception as exc:
            raise unavailable(f"the state store is unavailable: {exc}") from None
        if call is not None:
            return JSONResponse(call)
        if record is None:
            raise ApiError(
                404,
                f"unknown request {request_id!r} (never accepted, or its record expired "
                f"after {REQUEST_TTL_S:g} s)",
                type_=NOT_FOUND,
                param="request_id",
                code="request_not_found",
            )
        body: dict[str, Any] = {
            "request_id": public_request_id(record.request_id),
            "app": record.app,
            "kind": record.kind or None,
            "status": record.status,
            "deadline_s": record.deadline_s,
            "worker_id": record.worker_id,
        }
        completion = record.completion
        if completion is None:
            body["timeline"] = {
                "arrival_s": record.arrival_s,
                "assigned_s": None,
                "started_s": record.started_s,
                "first_token_s": None,
                "finished_s": None,
            }
            return JSONResponse(body)
        block = switchyard_block(completion, record.deadline_s)
        body.update(
            status=str(completion.status),
            worker_id=completion.worker_id,
            worker_type=completion.worker_type,
            variant=completion.variant,
            emulated=completion.emulated,
            deadline_s=block["deadline_s"],
            deadline_met=block["deadline_met"],
            result=None if completion.result is None else completion.result.model_dump(mode="json"),
            error=completion.error,
            timeline=timeline(completion),
        )
        return JSONResponse(body, headers=answer_headers(request_id, emulated=completion.emulated))

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the LLM applications, as OpenAI lists models."""
        data = [
            _model_object(app) for app in sorted(self.catalogue.llm.values(), key=lambda a: a.name)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``: one LLM application, as OpenAI retrieves a model."""
        name = request.path_params["model"]
        app = self.catalogue.llm.get(name)
        if app is None:
            known = ", ".join(sorted(self.catalogue.llm)) or "none"
            raise ApiError(
                404,
                f"the model '{name}' does not exist; served models: {known}",
                type_=NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        return JSONResponse(_model_object(app))

    async def apps(self, request: Request) -> Response:
        """``GET /v1/apps``: the classification applications (``data``) and the pipelines
        (``pipelines``: their stages in order, each with the stages it runs after, and
        their SLO in model seconds and as the wall-clock deadline a call gets)."""
        data = [
            {
                "name": app.name,
                "feature_dim": app.feature_dim,
                "classes": list(app.classes),
                "deadline_ms": app.deadline_s * 1000.0,
                "variants": list(app.variants),
            }
            for app in sorted(self.catalogue.classification.values(), key=lambda a: a.name)
        ]
        pipelines = [
            {
                "name": pipeline.name,
                "kind": "pipeline",
                "slo_s": pipeline.slo_s,
                "deadline_ms": pipeline.slo_s / self.time_scale * 1000.0,
                "models": list(pipeline.models()),
                "llm_applications": list(pipeline.llm_applications()),
                "stages": [_stage_object(stage) for stage in pipeline.stages],
            }
            for pipeline in sorted(self.catalogue.pipelines.values(), key=lambda p: p.name)
        ]
        return JSONResponse({"object": "list", "data": data, "pipelines": pipelines})

    async def openapi(self, request: Request) -> Response:
        """``GET /openapi.json``."""
        if self._openapi is None:
            self._openapi = openapi_document(self.catalogue)
        return JSONResponse(self._openapi)

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: 200 while serving, 503 once draining."""
        if self.admission.draining:
            return JSONResponse(
                {"status": "draining", "in_flight": self.admission.in_flight},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"status": "ok", "waiting": len(self.answers)})


def _model_object(app: LlmApplication) -> dict[str, Any]:
    """An LLM application as an OpenAI model object, with Switchyard's own fields."""
    return {
        "id": app.name,
        "object": "model",
        "created": 0,
        "owned_by": "switchyard",
        "switchyard": {
            "served_model": app.model,
            "slo_s": app.slo_s,
            "max_prompt_tokens": app.max_prompt_tokens,
            "max_output_tokens": app.max_output_tokens,
            "workload": str(app.workload),
            "ttft_slo_s": app.objectives.ttft_s,
            "tpot_slo_s": app.objectives.tpot_s,
        },
    }


def _stage_object(stage: Stage) -> dict[str, Any]:
    """One stage as ``GET /v1/apps`` lists it: an LLM stage's ``model`` is its LLM
    application, with the output tokens and choices it asks for."""
    described: dict[str, Any] = {
        "name": stage.name,
        "model": stage.model,
        "after": list(stage.after),
        "kind": "model" if stage.llm is None else "llm",
    }
    if stage.when is not None:
        described["when"] = {"stage": stage.when.stage, "label": stage.when.label}
    if stage.llm is not None:
        described["output_tokens"] = stage.llm.output_tokens
        if stage.llm.choices:
            described["choices"] = dict(stage.llm.choices)
    return described
