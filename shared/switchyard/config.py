"""Configuration from environment variables (``SWITCHYARD_*``).

Every service reads one :class:`Settings` object at start. Bad values stop the
process with a message that names each offending variable (see
:func:`load_settings`), never with a traceback.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from switchyard.errors import ConfigError

ENV_PREFIX = "SWITCHYARD_"
SECRET_FIELDS = frozenset({"kafka_sasl_password"})
"""Settings whose values no error message, log or listing shows."""


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseModel):
    """What a Switchyard process is configured with: one field per ``SWITCHYARD_*`` variable.

    Build it with :func:`load_settings`, which reads the environment.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_id: str = Field(
        default_factory=_default_instance_id,
        description="Name of this replica in logs, traces and consumer client ids.",
    )

    bus: Literal["memory", "kafka"] = Field(
        default="memory", description="Message bus: in-process memory, or Kafka."
    )
    kafka_bootstrap: str = Field(
        default="127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,host:port]."
    )
    topic_prefix: str = Field(
        default="",
        description="Prefix of every topic name, so several stacks can share one Kafka cluster.",
    )
    topic_partitions: int = Field(
        default=4, ge=1, le=1024, description="Partitions of each topic Switchyard creates."
    )
    commit_interval_s: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="How often consumers commit the offsets of handled messages.",
    )
    kafka_linger_ms: int = Field(
        default=0, ge=0, le=1000, description="Producer linger: batch wait before sending."
    )
    addressed_partitions: int = Field(
        default=64,
        ge=1,
        le=4096,
        description=(
            "Partitions of the addressed topics (worker inboxes, ingress answers) Switchyard "
            "creates: the most workers, and ingress replicas, that each read a partition of "
            "their own; beyond it they share partitions and skip each other's records."
        ),
    )
    kafka_fetch_max_wait_ms: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description=(
            "Longest a consumer's fetch waits on the broker when there is nothing new. The "
            "broker answers a waiting fetch as soon as a record arrives, so this does not "
            "delay delivery; it sets how often an idle consumer asks again (the broker's "
            "and the consumers' idle CPU)."
        ),
    )

    kafka_session_timeout_ms: int = Field(
        default=6_000,
        ge=1_000,
        le=300_000,
        description=(
            "How long a consumer group waits for a member that stopped heartbeating (a "
            "killed process) before its partitions move to the others: a scheduler "
            "replica's failover takes about this long. 6,000 is the least a broker accepts "
            "with its default group.min.session.timeout.ms; the local and compose brokers "
            "accept 1,000, and the compose stack uses 3,000."
        ),
    )
    kafka_heartbeat_interval_ms: int = Field(
        default=1_000,
        ge=100,
        le=100_000,
        description="How often a group member tells the broker it lives: at most a third "
        "of SWITCHYARD_KAFKA_SESSION_TIMEOUT_MS.",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description=(
            "How clients talk to the brokers: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
            "SASL_SSL (a user and password over TLS: what a managed Kafka asks for)."
        ),
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="SCRAM-SHA-512", description="SASL mechanism (with a SASL_* protocol)."
    )
    kafka_sasl_username: str = Field(
        default="",
        validate_default=True,
        description="SASL user (needed with a SASL_* protocol).",
    )
    kafka_sasl_password: SecretStr = Field(
        default=SecretStr(""),
        validate_default=True,
        description="SASL password (needed with a SASL_* protocol); never logged.",
    )
    kafka_ssl_cafile: str = Field(
        default="",
        description=(
            "PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL); "
            "empty: the system's trusted CAs."
        ),
    )
    kafka_ssl_certfile: str = Field(
        default="", description="PEM client certificate, for brokers that require one (mTLS)."
    )
    kafka_ssl_keyfile: str = Field(
        default="",
        validate_default=True,
        description="PEM private key of the client certificate (with kafka_ssl_certfile).",
    )

    state: Literal["memory", "redis"] = Field(
        default="memory", description="State store: in-process memory, or Redis."
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", description="Redis URL, redis://host:port/db."
    )
    state_prefix: str = Field(
        default="switchyard:", description="Prefix of every Redis key Switchyard writes."
    )
    memory_bus_bytes: int = Field(
        default=16 * 2**20,
        ge=2**16,
        description=(
            "Bytes of records each partition of the in-memory bus (the embedded stack) "
            "keeps, the latest; a consumer further behind skips to the oldest kept."
        ),
    )
    memory_max_keys: int = Field(
        default=100_000,
        ge=1_000,
        description=(
            "The most keys the in-memory state (the embedded stack) holds: past it the "
            "request records nearest their expiry go first. A record keeps its request, "
            "prompt included: about 7 KB for the conversation sample's prompts."
        ),
    )

    health_host: str = Field(
        default="127.0.0.1", description="Address of the health and readiness endpoint."
    )
    health_port: int = Field(
        default=8081, ge=0, le=65535, description="Port of the health endpoint; 0 picks a free one."
    )
    drain_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="How long a stopping service may take to finish in-flight work.",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Least severe log level written."
    )
    log_format: Literal["json", "text"] = Field(
        default="json", description="json: one JSON object a line; text: for people."
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description=(
            "OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318); traces and metrics "
            "are exported only when set. OTEL_EXPORTER_OTLP_ENDPOINT is honoured too."
        ),
    )

    # -- what the live stack serves -------------------------------------------------
    registry: str | None = Field(
        default=None,
        description=(
            "Application registry file (JSON or YAML). Unset: the default registry, built "
            "once into SWITCHYARD_CACHE_DIR (three classification applications and the "
            "default LLM applications)."
        ),
    )
    cache_dir: str = Field(
        default_factory=lambda: os.path.join(os.path.expanduser("~"), ".cache", "switchyard"),
        description="Where built models and downloads are cached.",
    )

    # -- ingress ---------------------------------------------------------------------
    http_host: str = Field(
        default="127.0.0.1",
        description=(
            "Address of the ingress HTTP API: loopback unless set (0.0.0.0 serves other "
            "machines; the container images set it)."
        ),
    )
    http_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of the ingress HTTP API; 0 picks one."
    )
    http_max_connections: int = Field(
        default=4096,
        ge=1,
        description=(
            "Connections and calls the ingress serves at once; beyond, new ones get 503 "
            "at once (keep the process's open-file limit above it)."
        ),
    )
    http_keep_alive_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description=(
            "How long the ingress keeps an idle keep-alive connection open: longer than "
            "clients keep theirs (httpx and the openai client 5 s, aiohttp 15 s), or a call "
            "sent on a connection the ingress is closing at that moment fails unanswered."
        ),
    )
    http_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "How long the ingress waits for a request's headers, from the connection (a "
            "later request on it: from its first byte): a slower client is answered 408 "
            "and disconnected, so idle or trickling connections cannot hold every "
            "connection place."
        ),
    )
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, description="Largest request body the ingress accepts."
    )
    answer_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest the ingress holds an HTTP call open waiting for its answer.",
    )
    drain_notice_s: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description=(
            "After SIGTERM, how long the ingress goes on taking calls while /healthz already "
            "answers 503 draining, so a load balancer stops sending it calls before it "
            "refuses any; set it above the balancer's health-check interval (compose: 2)."
        ),
    )

    auth: Literal["off", "api-key"] = Field(
        default="off",
        description=(
            "api-key: every /v1/ call needs Authorization: Bearer KEY, a key of a tenant in "
            "SWITCHYARD_API_KEYS_FILE or SWITCHYARD_API_KEYS (401 otherwise), and request "
            "ids are scoped to their tenant; off: one anonymous tenant (the embedded demo)."
        ),
    )
    api_keys_file: str | None = Field(
        default=None,
        description=(
            "JSON file of tenants: name, the SHA-256 of each key, and limits "
            "(`switchyard keys new TENANT` makes a key and its entry)."
        ),
    )
    api_keys: str | None = Field(
        default=None,
        description=(
            "Tenants as NAME=SHA256,...: the SHA-256 (hex) of each key, never the key; "
            "limits from SWITCHYARD_TENANT_*."
        ),
    )
    tenant_requests_per_s: float = Field(
        default=0.0,
        ge=0,
        description="Calls a second a tenant may make (token bucket); 0: no limit.",
    )
    tenant_burst: int = Field(
        default=0,
        ge=0,
        description="Calls a tenant may make at once above its rate; 0: one second's worth.",
    )
    tenant_max_concurrent: int = Field(
        default=0,
        ge=0,
        description="Inference calls a tenant may have in flight at once; 0: no limit.",
    )

    admission: Literal["off", "deadline"] = Field(
        default="deadline",
        description=(
            "Ingress admission control. deadline: a request that no worker serving its model "
            "can finish before its deadline (estimated from the monitor's heartbeats) is "
            "refused with 429 and Retry-After, one for a model no live worker has served for "
            "SWITCHYARD_ADMISSION_GRACE_S with 503 (a pipeline call: its stages' critical "
            "path on the emulated-models workers); off: every valid request is queued."
        ),
    )
    admission_slack: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description=(
            "A request is refused when its estimated wait plus service exceeds this many "
            "times the time left to its deadline; below 1 keeps headroom for estimation "
            "error, above 1 tolerates some lateness."
        ),
    )
    admission_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description=(
            "How long a model may have no live worker before the ingress answers its "
            "requests 503 (meanwhile the scheduler holds them until a worker comes)."
        ),
    )

    # -- scheduler, predictor, monitor ----------------------------------------------------
    llm_policy: str = Field(
        default="gaps", description="LLM scheduling policy (a name from `switchyard simulate`)."
    )
    llm_dispatch: Literal["scheduler", "direct"] = Field(
        default="direct",
        description=(
            "Who places LLM requests. direct: the ingress decides each itself with the "
            "scheduler's policy, records it with the request in one ledger round trip and "
            "sends it to the worker (one Kafka hop and one process fewer; each ingress "
            "replica accounts only for its own decisions between heartbeats); a request "
            "no live worker serves still goes to the scheduler. scheduler: the ingress "
            "publishes every request to the scheduler, which decides it (one place sees "
            "every replica's decisions)."
        ),
    )
    window_policy: str = Field(
        default="sneakpeek",
        description="Classification window scheduler (a name from `switchyard window`).",
    )
    window_s: float = Field(
        default=0.02,
        gt=0,
        le=10,
        description="How long the scheduler gathers classification requests into one window.",
    )
    prediction_wait_s: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description=(
            "Longest the scheduler waits for a classification request's SneakPeek estimate "
            "before deciding without it."
        ),
    )
    predictor_publish_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description=(
            "How often the predictor publishes its fitted model (when it learnt something), "
            "and how often the scheduler and rebalancer look for a new one."
        ),
    )
    heartbeat_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="How often a worker reports its state."
    )
    worker_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="A worker silent this long is declared dead and its work re-assigned.",
    )
    rebalance_interval_s: float = Field(
        default=1.0, gt=0, le=600, description="How often the rebalancer looks for moves."
    )
    placement_policy: str = Field(
        default="adaptive-balanced",
        description=(
            "Multi-model placement policy (a name from `switchyard multimodel`): the "
            "placement service's loads and unloads and the scheduler's stage routing."
        ),
    )
    pipeline_catalogue: Literal["txt2img", "alibaba-lora", "assistant"] = Field(
        default="txt2img",
        description=(
            "The pipelines served when the registry declares none: txt2img (three "
            "text-to-image pipelines), alibaba-lora (the Alibaba LoRA trace sample's "
            "catalogue, which `python -m loadgen replay --mix multimodel` replays) or "
            "assistant (pipelines with LLM stages: a classifier routing to one of two "
            "LLMs, and a draft checked by a larger model)."
        ),
    )
    placement_update_hz: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="Placement rounds per wall second (the policy's update frequency).",
    )

    # -- worker ---------------------------------------------------------------------------
    worker_id: str | None = Field(
        default=None, description="This worker's id; unset: the instance id."
    )
    worker_backend: Literal["emulated-llm", "torch", "emulated-models"] = Field(
        default="emulated-llm",
        description=(
            "emulated-llm: spends the time the performance model gives for worker_profile "
            "(an emulation, labelled so in every completion); torch: runs the real "
            "classification variants and the tiny torch language model; emulated-models: "
            "serves pipeline stages of the catalogue's multi-model models, loading and "
            "unloading them as the placement service orders, each load and stage taking "
            "the catalogue's load_s and exec_s (an emulation, labelled so)."
        ),
    )
    worker_cpu_cores: float = Field(
        default=16.0, ge=0, le=4096, description="An emulated-models worker's CPU cores."
    )
    worker_gpus: float = Field(
        default=2.0,
        ge=0,
        le=64,
        description="An emulated-models worker's GPUs (its GPU memory and compute share).",
    )
    worker_host_mem_gib: float = Field(
        default=128.0, ge=0, le=65536, description="An emulated-models worker's host memory."
    )
    worker_speed: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="An emulated-models worker's speed: service times are exec_s / speed.",
    )
    worker_gpu_type: str = Field(
        default="a100", description="The GPU type an emulated-models worker reports."
    )
    worker_profile: str = Field(
        default="a100-80gb/llama-2-7b",
        description="Performance profile (GPU/model) an emulated-llm worker emulates.",
    )
    worker_time_scale: float = Field(
        default=1.0,
        gt=0,
        le=1e6,
        description="Emulated time runs this many times faster than the modelled time.",
    )
    worker_max_slots: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description=(
            "Most requests an emulated-llm worker runs at once (vLLM's max_num_seqs), "
            "below its profile's; unset: the profile's."
        ),
    )
    worker_chunked_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description=(
            "Chunked prefill on an emulated-llm worker (vLLM's enable_chunked_prefill) at "
            "this token budget per iteration (max_num_batched_tokens), at least the "
            "profile's batch slots; unset: whole prompts are prefilled in iterations of "
            "their own."
        ),
    )
    worker_role: Literal["mixed", "prefill", "decode"] = Field(
        default="mixed",
        description=(
            "Prefill/decode disaggregation on an emulated-llm worker: mixed runs both "
            "phases; prefill takes new requests and hands each, with its KV cache, to the "
            "decode worker chosen with it once its first token is out; decode takes only "
            "those hand-offs. A cluster with decode workers is disaggregated under any LLM "
            "policy."
        ),
    )
    worker_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Torch device of a torch worker; auto: CUDA when present."
    )
    worker_memory_bytes: int = Field(
        default=2 * 1024**3,
        ge=1,
        description="Memory budget of a torch worker's model cache.",
    )
    worker_max_batch: int = Field(
        default=32, ge=1, le=4096, description="Most requests a worker runs in one batch."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port], got {server.strip()!r}")
        return value

    @field_validator("kafka_heartbeat_interval_ms")
    @classmethod
    def _heartbeats_within_session(cls, value: int, info: ValidationInfo) -> int:
        session_ms = info.data.get("kafka_session_timeout_ms")
        if session_ms is not None and value * 3 > session_ms:
            raise ValueError(
                f"at most a third of SWITCHYARD_KAFKA_SESSION_TIMEOUT_MS ({session_ms}), so "
                "that one lost heartbeat does not cost a member its partitions"
            )
        return value

    @field_validator("kafka_sasl_username", "kafka_sasl_password")
    @classmethod
    def _sasl_needs_credentials(cls, value: str | SecretStr, info: ValidationInfo) -> object:
        protocol = info.data.get("kafka_security_protocol", "PLAINTEXT")
        given = value.get_secret_value() if isinstance(value, SecretStr) else value
        if protocol.startswith("SASL_") and not given:
            raise ValueError(f"needed with SWITCHYARD_KAFKA_SECURITY_PROTOCOL={protocol}")
        return value

    @field_validator("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")
    @classmethod
    def _readable_pem(cls, value: str, info: ValidationInfo) -> str:
        if value and not os.access(value, os.R_OK):
            raise ValueError("no such file, or not readable")
        if info.field_name == "kafka_ssl_keyfile" and bool(value) != bool(
            info.data.get("kafka_ssl_certfile")
        ):
            raise ValueError(
                "a client certificate needs both SWITCHYARD_KAFKA_SSL_CERTFILE and _KEYFILE"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        return value

    def effective_otlp_endpoint(self) -> str | None:
        """The OTLP endpoint to export to: ours first, then OpenTelemetry's standard variable."""
        return self.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Read :class:`Settings` from the environment (or ``env``), naming every bad variable.

    Args:
        env: variables to read instead of ``os.environ`` (tests pass their own).
        overrides: field values that win over the environment.

    Raises:
        ConfigError: one line per invalid variable, e.g.
            ``SWITCHYARD_HEALTH_PORT='http': Input should be a valid integer``.
    """
    source = os.environ if env is None else env
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        raw = source.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = raw
    values.update(overrides)
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            shown = "<hidden>" if field in SECRET_FIELDS else values.get(field, "<unset>")
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{ENV_PREFIX}{field.upper()}={shown!r}: {message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
