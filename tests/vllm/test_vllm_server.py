"""vLLM's OpenAI server as users run it: ``cactus serve`` on a small stdlib pair, over
loopback HTTP. One server (module scope, about 2 minutes to start on 2 shared cores) serves
every test here; the last test stops it with SIGTERM.

The server's engine rule is cactus δ = 1; requests choose theirs with
``vllm_xargs.cactus_rule``. Statistical assertions: per rule 16 seeded requests x 48
tokens, about 190 (cactus δ = 1) to 240 (sps) verify steps of k = 3 drafts, batched as the
scheduler admits them (so not bit-reproducible); an AL then has a standard error of about
0.07, and each threshold is 4 or more standard errors from the values measured here
(sps 2.32, cactus δ = 0 2.34, cactus δ = 1 3.00).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

from cactus_theory.vllm import metrics, serve  # noqa: E402

ENGINE_RULE = "cactus:delta=1.0"
START_TIMEOUT_S = 420
REQUEST_TIMEOUT_S = 240
PROMPTS = [
    "def parse(self, fp):\n",
    "import email\n",
    "class Message:\n",
    "    return self._headers\n",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


class Server:
    def __init__(self, url, model, process, log_path, shm_before):
        self.url, self.model, self.process = url, model, process
        self.log_path, self.shm_before = log_path, shm_before

    def log_tail(self, chars=4000):
        with open(self.log_path, errors="replace") as log:
            return log.read()[-chars:]

    def post(self, path, body):
        """(status, headers, parsed JSON body)."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read())

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.read().decode()

    def complete(self, prompt, rule=None, **fields):
        body = {"model": self.model, "prompt": prompt, "max_tokens": 32, "temperature": 1.0}
        body.update(ignore_eos=True, **fields)
        if rule is not None:
            body["vllm_xargs"] = {"cactus_rule": rule}
        return self.post("/v1/completions", body)

    def engine_counters(self):
        """What ``metrics.read`` answers, from the engine (vLLM's dev-mode RPC route)."""
        status, _, body = self.post("/collective_rpc", {"method": "cactus_metrics"})
        assert status == 200, body
        return metrics.first_snapshot(body["results"])

    def reset(self):
        status, _, body = self.post("/collective_rpc", {"method": "cactus_metrics_reset"})
        assert status == 200, body

    def scrape(self):
        """{(metric name, rule label or None): value} from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.get("/metrics")
        assert status == 200
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith(("cactus:", "vllm:spec_decode_num")):
                    values[(sample.name, sample.labels.get("rule"))] = sample.value
        return values


@pytest.fixture(scope="module")
def server(small_stdlib_pair, tmp_path_factory):
    verifier, draft, _ = small_stdlib_pair
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACTUS_VLLM", "VLLM_"))}
    env.update(
        OMP_NUM_THREADS="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_SERVER_DEV_MODE="1",  # /collective_rpc, to read the counters as metrics.read does
    )
    user_rules = os.path.join(os.path.dirname(__file__), "user_rules.py")
    command = [sys.executable, "-m", "cactus_theory.cli", "serve", verifier, draft]
    command += ["--rules-module", user_rules]
    command += ["--rule", ENGINE_RULE, "-k", "3", "--port", str(port), "--enforce-eager"]
    command += ["--dtype", "float32", "--max-model-len", "256", "--seed", "0"]
    command += ["--max-num-seqs", "16", "--disable-uvicorn-access-log"]
    # Dev mode (for /collective_rpc) also logs the stack of every error *response*; off, so
    # that a traceback in the log is an unhandled error (what the bad-spec test looks for).
    command += ["--no-log-error-stack"]
    shm_before = shm_names()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    handle = Server(f"http://127.0.0.1:{port}", verifier, process, log_path, shm_before)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, "server exited:\n" + handle.log_tail()
            assert time.monotonic() < deadline, "server did not start:\n" + handle.log_tail()
            try:
                if handle.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        yield handle
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        for pid in group_members(process.pid):
            os.kill(pid, signal.SIGKILL)


def test_sixteen_concurrent_requests_with_mixed_rules_all_succeed(server):
    # (rule in vllm_xargs or None = the engine's, temperature, the header we expect)
    cases = [
        (None, 1.0, ENGINE_RULE),
        ("sps", 1.0, "sps"),
        ("vllm", 1.0, "vllm"),
        ("frontier:delta=0.5", 1.0, "frontier:delta=0.5"),
        ("cactus:delta=0.5", 0.0, "vllm-greedy"),  # temperature 0: vLLM's greedy path
        ("cactus-exact:delta=1.0", 1.0, "cactus-exact:delta=1.0"),
        ("tas:epsilon=0.1", 0.7, "tas:epsilon=0.1"),
        ("interp:alpha=0.5", 1.0, "interp:alpha=0.5"),
    ] * 2
    assert len(cases) == 16

    def one(index):
        rule, temperature, _ = cases[index]
        prompt = PROMPTS[index % len(PROMPTS)]
        return server.complete(prompt, rule, temperature=temperature, seed=index)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
    for (rule, _, header), (status, headers, body) in zip(cases, answers, strict=True):
        assert status == 200, (rule, body)
        assert body["usage"]["completion_tokens"] == 32, rule
        assert {k.lower(): v for k, v in headers.items()}[serve.HEADER] == header
    seen = server.engine_counters()
    for rule in (ENGINE_RULE, "sps", "vllm", "frontier:delta=0.5", "vllm-greedy"):
        assert seen[rule]["steps"] > 0, rule


def test_the_request_rule_changes_the_accepted_length_in_metrics(server):
    server.reset()
    before = server.scrape()
    rules = ("sps", "cactus:delta=0.0", "cactus:delta=1.0")
    jobs = [(rule, i) for i in range(16) for rule in rules]

    def one(job):
        rule, i = job
        return server.complete(PROMPTS[i % len(PROMPTS)], rule, seed=1000 + i, max_tokens=48)

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, jobs))
    assert all(status == 200 for status, _, _ in answers)
    after = server.scrape()
    engine = server.engine_counters()
    assert set(engine) == set(rules)

    def exported(name, rule):
        return after[(f"cactus:spec_decode_{name}", rule)]

    # /metrics carries exactly the engine's counters (what metrics.read gives).
    for rule in rules:
        summary = engine[rule]
        assert exported("num_steps_total", rule) == summary["steps"]
        assert exported("num_draft_tokens_total", rule) == summary["drafts"]
        assert exported("num_accepted_tokens_total", rule) == summary["accepted"]
        assert exported("num_emitted_tokens_total", rule) == summary["tokens"]
        assert exported("accepted_length", rule) == summary["accepted_length"]
        assert exported("acceptance_rate", rule) == summary["acceptance_rate"]
        assert exported("kl_per_token", rule) == summary["kl_per_token"]
        assert summary["steps"] > 120, (rule, summary)
    # ... and they add up to vLLM's own spec-decode counters over the same requests.
    for ours, theirs in (("drafts", "draft_tokens"), ("accepted", "accepted_tokens")):
        name = f"vllm:spec_decode_num_{theirs}_total"
        assert (
            sum(engine[rule][ours] for rule in rules) == after[(name, None)] - before[(name, None)]
        )
    lengths = {rule: exported("accepted_length", rule) for rule in rules}
    # cactus δ = 1 raises AL; δ = 0 (the negative control: SpS's acceptance) does not.
    print("AL per rule via /metrics:", lengths)
    assert lengths["cactus:delta=1.0"] > lengths["sps"] + 0.4
    assert abs(lengths["cactus:delta=0.0"] - lengths["sps"]) < 0.4
    assert exported("kl_per_token", "sps") == 0.0
    assert exported("kl_per_token", "cactus:delta=1.0") > 0.0


def test_a_bad_spec_is_a_400_naming_the_field_and_the_server_keeps_serving(server):
    """Every malformed value is a clean 400 (no traceback in the server's log), and a spec
    naming a module is an unknown rule: a request never imports anything."""
    logged = len(server.log_tail(10**9))
    cases = (
        ("cactus:delta=-1", "delta"),
        ("no-such-rule", "no-such-rule"),
        (3, "int"),
        ([1, 2], "list"),
        ({"rule": "sps"}, "dict"),
        ("os", "unknown rule 'os'"),
        ("cactus_theory.engines.sglang", "unknown rule"),
        ("subprocess:run=1", "unknown rule 'subprocess'"),
    )
    for spec, says in cases:
        status, _, body = server.complete("import os\n", spec)
        assert status == 400, body
        if body["error"]["param"] == "body.vllm_xargs.cactus_rule":
            # vLLM's request schema refuses some non-string values (a dict) before our
            # check: its own clean 400 on the same field.
            assert isinstance(spec, list | dict), body
            continue
        assert body["error"]["param"] == "vllm_xargs.cactus_rule"
        assert says in body["error"]["message"]
    assert "Traceback" not in server.log_tail(10**9)[logged:]
    status, headers, body = server.complete("import os\n", "sps", seed=5)
    assert status == 200 and body["usage"]["completion_tokens"] == 32
    assert server.get("/health")[0] == 200


def test_an_engines_rule_and_a_users_rule_are_served_over_http(server):
    """relaxed (TensorRT-LLM's rule, bundled) and test-boost (a user's module, loaded by
    ``cactus serve --rules-module`` in every server process) verify requests by name."""
    for spec in ("relaxed:top_k=10,delta=0.6", "test-boost:factor=3.0"):
        status, headers, body = server.complete("def parse(self):\n", spec, seed=3)
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 32
        assert headers[serve.HEADER] == spec
    scraped = server.scrape()
    for spec in ("relaxed:top_k=10,delta=0.6", "test-boost:factor=3.0"):
        assert scraped[("cactus:spec_decode_kl_per_token", spec)] >= 0.0


def test_an_openai_client_gets_the_rule_and_its_header(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    raw = client.completions.with_raw_response.create(
        model=server.model,
        prompt="class Parser:\n",
        max_tokens=16,
        temperature=1.0,
        extra_body={"vllm_xargs": {"cactus_rule": "sps"}, "ignore_eos": True},
    )
    assert raw.headers[serve.HEADER] == "sps"
    assert raw.parse().usage.completion_tokens == 16


def test_sigterm_leaves_no_child_process_and_no_shared_memory(server):
    pgid = server.process.pid
    assert len(group_members(pgid)) >= 3  # API server, EngineCore, worker (at least)
    created = shm_names() - server.shm_before
    assert created, "expected vLLM's message queues in /dev/shm while serving"
    os.killpg(pgid, signal.SIGTERM)
    server.process.wait(timeout=120)
    deadline = time.monotonic() + 30
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert group_members(pgid) == []
    assert created & shm_names() == set()
    log = server.log_tail(200_000)
    assert "leaked shared_memory" not in log, log[-3000:]
