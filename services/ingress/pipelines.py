"""Pipeline calls: ``POST /v1/apps/{pipeline}/infer`` runs a DAG of model stages.

The ingress coordinates the DAG itself. A call gets an id (the client's ``request_id``
scoped by its tenant, or a new one); each stage whose ``after`` stages are all done
becomes a request of its own, ``{call id}.{stage}``, with a
:class:`~switchyard.contracts.messages.StagePayload` carrying the outputs of the stages
it runs after (the first stages get the call's ``input``, named ``input``). A stage's
request is accepted in the request ledger and published exactly as any request that
goes to the scheduler (:meth:`~services.ingress.calls.RequestDesk.accept`:
``switchyard.stage-requests``, ``reply_to`` this replica), and its
:class:`~switchyard.contracts.messages.Completion` comes back here like any answer. An
LLM stage's request is a completion instead (:mod:`services.ingress.pipeline_llm`: the
call's input and the earlier stages' outputs as its prompt), which goes to
``switchyard.requests`` and an LLM worker like any completion.
Stages that do not depend on each other run at once (``txt2img-hd``'s ``upscale`` and
``check`` both follow ``generate``). A conditional stage runs only when the classifier
stage it names answered its label, and is otherwise skipped, as is a stage whose every
earlier stage was (``txt2img-checked`` upscales only what ``check`` labels ``safe``;
:func:`switchyard.multimodel.branching.stage_runs`); a skipped stage counts as done.

Every stage's deadline is the call's: arrival plus the pipeline's SLO, which the
catalogue gives in model seconds, divided by ``SWITCHYARD_WORKER_TIME_SCALE`` (an
emulated worker spends model time that much faster). A stage that becomes ready after
that deadline is due at once.

How a call ends:

- with admission control on, a new call its stages cannot finish before its deadline:
  429 (or 503 without a live emulated-models worker) with ``Retry-After``, before any
  stage is recorded (:mod:`services.ingress.pipeline_admission`; a retry of a call
  already accepted is not judged again);
- every stage ``ok`` or skipped: 200 with the output of the first stage of the
  pipeline's ``answer`` that ran, or without one the outputs of the stages run that
  nothing run after reads, each stage's worker, status and times, and the stages
  skipped (:func:`pipeline_answer`);
- a stage ``failed``, ``expired`` or ``cancelled``: the error its status gives any
  request (502, 504, 409), its message naming the stage, its model and the reason; no
  later stage is started (a stage already running beside it runs on, unwaited);
- no answer within ``answer_timeout_s`` (the whole call): 504 naming what is pending; the
  stages run on, and a retry with the same ``request_id`` resumes the call;
- a stage that cannot be recorded or published (the store or the bus unavailable): the
  first stages' refusal as any request's (503: nothing was started); a later stage's,
  once others are recorded, ``503 outcome_unknown`` naming the call: it was started, and
  a retry with its id resumes it;
- the client goes away: the stages that have not started are cancelled, none is started
  after, and the call ends as any call whose client left (499).

A retry with the same ``request_id`` runs no stage twice: the ledger refuses a second
accept of a stage's id, and the desk gives the earlier stage's answer (recorded, or
awaited with the first call, or polled from the record); a retry that asks something
else (another input or ``exec_scale``) is a 409, as for any request id reused.

Tracing: each stage has an INTERNAL span (``stage {name}``, child of the call's SERVER
span) from its acceptance to its answer; its request is published inside it, so the
scheduler's and the worker's spans hang below it and one trace shows the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode, TracerProvider
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive
from switchyard import __version__
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    StagePayload,
)
from switchyard.lifecycle import CANCELLED_BY_CLIENT
from switchyard.multimodel.branching import stage_runs
from switchyard.multimodel.model import PipelineSpec, Stage
from switchyard.serving.catalogue import LlmApplication

from services.ingress.auth import tenant_of
from services.ingress.body import json_body
from services.ingress.calls import RequestDesk, client_gone, refusal, status_error
from services.ingress.errors import SERVER_ERROR, ApiError
from services.ingress.openai_schema import parse
from services.ingress.pipeline_admission import PipelineGate
from services.ingress.pipeline_body import PipelineBody, check_stage_ids
from services.ingress.pipeline_call import PipelineCall, StageRun, pipeline_answer, stage_blocks
from services.ingress.pipeline_llm import llm_stage_payload, stage_inputs, stage_prompt
from services.ingress.responses import answer_headers
from services.ingress.telemetry import INSTRUMENTATION_NAME, call_record
from services.ingress.tokens import approximate_tokens

log = logging.getLogger("switchyard.ingress")

INPUT = "input"
"""The name the call's input has among the first stages' inputs."""


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """Limits and timings of pipeline calls.

    Attributes:
        max_body_bytes: largest request body (413 beyond it).
        answer_timeout_s: longest a call waits for all its stages (504 after).
        time_scale: emulated workers run this many times faster than model time
            (``SWITCHYARD_WORKER_TIME_SCALE``): a pipeline's SLO is divided by it.
    """

    max_body_bytes: int = 1_048_576
    answer_timeout_s: float = 300.0
    time_scale: float = 1.0


class PipelineCoordinator:
    """Answers pipeline calls (see the module docstring).

    Args:
        desk: accepts and publishes the stages' requests, and hands their answers.
        options: limits and timings.
        clock: epoch seconds.
        tracer_provider: where the stage spans go; None: the process-wide provider.
        gate: deadline-aware admission of new calls
            (:mod:`services.ingress.pipeline_admission`); None: every call accepted.
        llm_apps: the LLM applications LLM stages may name, by name.
    """

    def __init__(
        self,
        desk: RequestDesk,
        options: PipelineOptions,
        *,
        clock: Callable[[], float] = time.time,
        tracer_provider: TracerProvider | None = None,
        gate: PipelineGate | None = None,
        llm_apps: Mapping[str, LlmApplication] | None = None,
    ) -> None:
        self.desk = desk
        self.llm_apps: Mapping[str, LlmApplication] = llm_apps or {}
        self.options = options
        self.clock = clock
        self.gate = gate
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__, tracer_provider)

    async def infer(self, request: Request, pipeline: PipelineSpec) -> Response:
        """``POST /v1/apps/{pipeline}/infer``."""
        arrival_s = self.clock()
        if (record := call_record(request.scope)) is not None:
            record.app = pipeline.name
        body = parse(PipelineBody, await json_body(request, self.options.max_body_bytes))
        tenant = tenant_of(request.scope)
        call_id = tenant.scoped(body.request_id or f"req-{uuid.uuid4().hex}")
        check_stage_ids(call_id, pipeline, client_id=body.request_id)
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("switchyard.request_id", call_id)
        slo_s = pipeline.slo_s / self.options.time_scale
        call = PipelineCall(
            call_id=call_id,
            pipeline=pipeline,
            tenant=tenant,
            input=body.input,
            exec_scale=body.exec_scale,
            arrival_s=arrival_s,
            deadline_s=arrival_s + slo_s,
            slo_s=slo_s,
        )
        if self.gate is not None:
            await self._admit(call, self.gate, named=body.request_id is not None)
        await self.run(call, request.receive)
        answer = pipeline_answer(call, self.clock())
        if record is not None:
            record.deadline_met = answer["met_slo"]
        return JSONResponse(
            answer, headers=answer_headers(call.public_id, emulated=answer["emulated"])
        )

    async def _admit(self, call: PipelineCall, gate: PipelineGate, *, named: bool) -> None:
        """Refuse (429 or 503, nothing recorded) a new call its stages cannot finish in
        time; a retry of a call already accepted (its first stage recorded) is not
        judged again."""
        decision = gate.decide(
            call.pipeline,
            exec_scale=call.exec_scale,
            arrival_s=call.arrival_s,
            deadline_s=call.deadline_s,
            now_s=self.clock(),
            call_id=call.call_id,
            input_tokens=approximate_tokens(call.input),
        )
        if decision.admitted:
            return
        first = call.pipeline.stages[0]
        if named and await self.desk.read(f"{call.call_id}.{first.name}") is not None:
            return
        log.debug(
            "refused pipeline call %s: %s",
            call.call_id,
            decision.reason,
            extra={"event": "admission_refused", "verdict": str(decision.verdict)},
        )
        raise refusal(
            decision,
            f"pipeline {call.pipeline.name!r}",
            judged_on="along its stages' critical path on the workers that serve them",
        )

    async def run(self, call: PipelineCall, receive: Receive | None = None) -> None:
        """Run ``call``'s stages until the last is answered; raises the
        :class:`~services.ingress.errors.ApiError` the call ends with otherwise."""
        gone = asyncio.ensure_future(_disconnected(receive)) if receive is not None else None
        waits: dict[asyncio.Future[Completion | None], StageRun] = {}
        give_up_at = time.monotonic() + self.options.answer_timeout_s
        answered_at_s: float | None = None
        try:
            await self._start_ready(call, waits, give_up_at)
            while waits:
                left = give_up_at - time.monotonic()
                watched: set[asyncio.Future[Any]] = set(waits)
                if gone is not None:
                    watched.add(gone)
                done, _ = await asyncio.wait(
                    watched, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED
                )
                if gone is not None and gone in done:
                    await self._cancel_pending(call)
                    raise client_gone()
                if not done:
                    raise self._timeout(call)
                for future in done:
                    run = waits.pop(future)
                    completion = future.result()
                    if completion is None:
                        raise self._timeout(call)
                    self._finish(call, run, completion)
                await self._start_ready(call, waits, give_up_at)
            answered_at_s = self.clock()
        finally:
            if self.gate is not None:
                self.gate.call_ended(call.call_id, answered_at_s)
            for future in waits:
                future.cancel()
            if gone is not None:
                gone.cancel()
            for run in call.stages.values():
                if run.accepted is not None:
                    self.desk.release(run.accepted)
                if run.span is not None and run.span.is_recording():
                    run.span.set_status(Status(StatusCode.ERROR, "not answered"))
                    run.span.end()

    async def _start_ready(
        self,
        call: PipelineCall,
        waits: dict[asyncio.Future[Completion | None], StageRun],
        give_up_at: float,
    ) -> None:
        """Start every stage that is ready; a stage whose answer is recorded already (a
        retry) finishes at once, and may make more ready."""
        while ready := call.ready():
            answered = call.answered()
            for stage in ready:
                if not stage_runs(stage, answered, call.skipped):
                    call.skipped.add(stage.name)
                    if self.gate is not None:
                        self.gate.stage_dropped(call.call_id, stage.name)
                    continue
                run = await self._start(call, stage)
                if self.gate is not None:
                    self.gate.stage_sent(call.call_id, stage.name, self.clock())
                accepted = run.accepted
                assert accepted is not None
                if accepted.stored is not None:
                    self._finish(call, run, accepted.stored)
                    continue
                left = max(give_up_at - time.monotonic(), 0.0)
                # A task per stage: a call waits for several stages at once. It only
                # awaits the answer (no publish, no span), so cancelling it is safe.
                waits[asyncio.ensure_future(self.desk.completion(accepted, left))] = run

    async def _start(self, call: PipelineCall, stage: Stage) -> StageRun:
        """Accept and publish ``stage``'s request (or find the earlier one, a retry)."""
        run = StageRun(stage, f"{call.call_id}.{stage.name}")
        call.stages[stage.name] = run
        run.span = self.tracer.start_span(
            f"stage {stage.name}",
            attributes={
                "switchyard.pipeline": call.pipeline.name,
                "switchyard.stage": stage.name,
                "switchyard.model": stage.model,
                "switchyard.request_id": run.request_id,
            },
        )
        try:
            make_request = self._request_maker(call, stage)
            with trace.use_span(run.span, end_on_exit=False):
                run.accepted = await self.desk.accept(
                    f"{call.public_id}.{stage.name}",
                    make_request,
                    stream=False,
                    what=f"stage {stage.name!r} of pipeline {call.pipeline.name!r}",
                    tenant=call.tenant,
                )
        except ApiError as exc:
            started = any(other.accepted is not None for other in call.stages.values())
            raise _stage_refused(call, stage, exc, started=started) from None
        record = run.accepted.record
        if not stage.after and record is not None and record.arrival_s is not None:
            # A retry: the call arrived when its first stages did, and is due then.
            call.arrival_s = min(call.arrival_s, record.arrival_s)
            if record.deadline_s is not None:
                call.deadline_s = record.deadline_s
        return run

    def _payload(self, call: PipelineCall, stage: Stage) -> StagePayload | LLMPayload:
        """What ``stage`` asks of a worker: a model stage's :class:`StagePayload`, an LLM
        stage's completion (:mod:`services.ingress.pipeline_llm`)."""
        outputs = {name: call.stages[name].output for name in stage.after if name in call.stages}
        if stage.llm is None:
            return StagePayload(
                pipeline=call.pipeline.name,
                stage=stage.name,
                model=stage.model,
                exec_scale=call.exec_scale,
                inputs=stage_inputs(outputs) if stage.after else {INPUT: call.input},
            )
        app = self.llm_apps.get(stage.model)
        if app is None:
            raise _misconfigured(
                call,
                stage,
                f"its LLM application is not served (served: "
                f"{', '.join(sorted(self.llm_apps)) or 'none'})",
            )
        return llm_stage_payload(
            app,
            stage.llm,
            stage_prompt(call.input, outputs),
            time_scale=self.options.time_scale,
            what=f"stage {stage.name!r} of pipeline call {call.public_id}",
        )

    def _request_maker(self, call: PipelineCall, stage: Stage) -> Callable[[str], InferenceRequest]:
        """What makes ``stage``'s request from its id; a stage the catalogue names in a
        way no request can carry is a 500 naming it (bad configuration, not bad input)."""
        now_s = self.clock()
        arrival_s = call.arrival_s if not stage.after else max(now_s, call.arrival_s)
        answers = self.desk.answers
        try:
            payload = self._payload(call, stage)
        except ValidationError as exc:
            raise _invalid(call, stage, exc) from None

        def make(request_id: str) -> InferenceRequest:
            try:
                return InferenceRequest(
                    request_id=request_id,
                    app=call.pipeline.name,
                    payload=payload,
                    arrival_s=arrival_s,
                    # Late already: due at once (the deadline may not precede arrival).
                    deadline_s=max(call.deadline_s, arrival_s),
                    tenant=call.tenant.name,
                    reply_to=answers.instance_id,
                    reply_partition=answers.reply_partition,
                )
            except ValidationError as exc:
                raise _invalid(call, stage, exc) from None

        return make

    def _finish(self, call: PipelineCall, run: StageRun, completion: Completion) -> None:
        """Take a stage's answer; raises the call's error when it is not ``ok``."""
        run.completion = completion
        if run.span is not None:
            run.span.set_attributes(
                {
                    "switchyard.worker_id": completion.worker_id,
                    "switchyard.status": str(completion.status),
                }
            )
            if completion.status is not CompletionStatus.OK:
                run.span.set_status(Status(StatusCode.ERROR, str(completion.status)))
            run.span.end()
        if completion.status is not CompletionStatus.OK:
            raise stage_error(call, run.spec, completion)

    async def _cancel_pending(self, call: PipelineCall) -> None:
        """The client left: cancel the stages not started (a started one runs on)."""
        now_s = self.clock()
        for run in call.pending():
            try:
                outcome: str = await self.desk.ledger.cancel(
                    run.request_id, now_s, "the client disconnected before it started"
                )
            except Exception as exc:
                outcome = f"not cancelled ({exc})"
            log.info(
                "the client of pipeline call %s went away: stage %s %s",
                call.call_id,
                run.spec.name,
                outcome,
                extra={"event": "client_gone", "outcome": outcome},
            )

    def _timeout(self, call: PipelineCall) -> ApiError:
        pending = call.pending()
        names = ", ".join(f"{run.spec.name} ({run.spec.model})" for run in pending)
        return ApiError(
            504,
            f"pipeline {call.pipeline.name!r} call {call.public_id} was not answered within "
            f"{self.options.answer_timeout_s:g} s (waiting for stage {names or 'none'}); its "
            f"stages were accepted and may still finish: call again with request_id "
            f"{call.public_id!r} to resume it and get its answer (no stage runs twice)",
            type_=SERVER_ERROR,
            code="answer_timeout",
            headers=answer_headers(call.public_id, emulated=False),
            extra={
                "switchyard": {
                    "request_id": call.public_id,
                    "status": "pending",
                    "pending_stages": [run.spec.name for run in pending],
                }
            },
        )


def stage_error(call: PipelineCall, stage: Stage, completion: Completion) -> ApiError:
    """The error a call ends with when ``stage`` was not served: the status and code any
    request gets for that answer (:func:`~services.ingress.calls.status_error`), with a
    message naming the stage, its model and the reason."""
    error = status_error(completion, call.deadline_s)
    assert error is not None
    reason = completion.error or "no reason given"
    if completion.status is CompletionStatus.EXPIRED:
        what = f"expired: the call's deadline passed before it was served ({reason})"
    elif completion.worker_id == CANCELLED_BY_CLIENT:
        what = f"was cancelled ({reason}); nothing ran it: call again with a new request_id"
    elif completion.status is CompletionStatus.FAILED:
        what = f"failed on worker {completion.worker_id}: {reason}"
    else:
        what = f"was cancelled on worker {completion.worker_id}: {reason}"
    later = [s.name for s in call.pipeline.stages if s.name not in call.stages]
    return ApiError(
        error.status,
        f"pipeline {call.pipeline.name!r} call {call.public_id}: stage {stage.name!r} (model "
        f"{stage.model!r}) {what}" + (f"; not started: {', '.join(later)}" if later else ""),
        type_=error.type_,
        param=error.param,
        code=error.code,
        headers=answer_headers(call.public_id, emulated=completion.emulated),
        extra={
            "switchyard": {
                "request_id": call.public_id,
                "app": call.pipeline.name,
                "stage": stage.name,
                "model": stage.model,
                "status": str(completion.status),
                "error": completion.error,
                "stages": list(stage_blocks(call)),
            }
        },
    )


def _misconfigured(call: PipelineCall, stage: Stage, why: str) -> ApiError:
    """A stage the catalogue names in a way no request can carry: bad configuration, not
    bad input (500 naming the stage)."""
    return ApiError(
        500,
        f"pipeline {call.pipeline.name!r} cannot run stage {stage.name!r} (model "
        f"{stage.model!r}): {why}; the serving catalogue needs fixing",
        type_=SERVER_ERROR,
        code="pipeline_misconfigured",
    )


def _invalid(call: PipelineCall, stage: Stage, exc: ValidationError) -> ApiError:
    problem = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in problem["loc"])
    return _misconfigured(call, stage, f"its request is invalid at {where}: {problem['msg']}")


def _stage_refused(call: PipelineCall, stage: Stage, exc: ApiError, *, started: bool) -> ApiError:
    """A stage's request refused before anything ran it (409 id reused, 503 store or bus
    unavailable, outcome unknown): the same status, told about the call, not the stage's
    own request id (a client retries the call). ``started``: other stages of the call are
    recorded already, so a refusal that would say "nothing was started" (a 429 or 503)
    is ``503 outcome_unknown`` instead: the call was started, and a retry resumes it."""
    status, code = exc.status, exc.code
    if exc.code == "request_id_reused":
        message = (
            f"request_id {call.public_id!r} was used for a different call (another "
            f"pipeline, input or exec_scale); a retry must repeat the call exactly, and a "
            f"new call needs a new request_id"
        )
    elif exc.code == "outcome_unknown":
        message = (
            f"stage {stage.name!r} of pipeline call {call.public_id} may or may not have "
            f"been queued; call again with request_id {call.public_id!r} to resume it (no "
            f"stage runs twice)"
        )
    elif started and exc.status in (429, 503):
        status, code = 503, "outcome_unknown"
        message = (
            f"pipeline call {call.public_id} was started, but its stage {stage.name!r} "
            f"(model {stage.model!r}) could not be: {exc.message}; call again with "
            f"request_id {call.public_id!r} to resume it (no stage runs twice)"
        )
    else:
        message = (
            f"pipeline {call.pipeline.name!r} call {call.public_id}: stage {stage.name!r} "
            f"(model {stage.model!r}) could not be started: {exc.message}"
        )
    extra = dict(exc.extra)
    if "switchyard" in extra:
        extra["switchyard"] = {**extra["switchyard"], "request_id": call.public_id}
    return ApiError(
        status,
        message,
        type_=exc.type_,
        param=exc.param,
        code=code,
        headers=exc.headers,
        extra=extra,
    )


async def _disconnected(receive: Receive) -> None:
    """Return once the client closed its connection (the body was read already); never
    returns when ``receive`` breaks (that is no sign the client left)."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await asyncio.Event().wait()


__all__ = [
    "INPUT",
    "PipelineCall",
    "PipelineCoordinator",
    "PipelineOptions",
    "pipeline_answer",
    "stage_error",
]
