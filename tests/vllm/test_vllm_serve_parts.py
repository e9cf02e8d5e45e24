"""The pieces of ``cactus serve`` without a server: the request check, the header rule,
the Prometheus collector, the command line, and the shared-memory teardown."""

import os
import shlex
import signal

import pytest

pytest.importorskip("vllm.v1.sample.rejection_sampler", reason="vLLM is not installed here")

from cactus_theory.cli import dispatch as cli  # noqa: E402
from cactus_theory.vllm import config, metrics, plugin, serve  # noqa: E402


def test_request_spec_check_names_the_field():
    config.check_request_spec(None, "probabilistic")
    config.check_request_spec({"other": 1}, "probabilistic")
    config.check_request_spec({"cactus_rule": "cactus:delta=0.5"}, "probabilistic")
    config.check_request_spec({"cactus_rule": "vllm"}, "greedy")
    config.check_request_spec({"cactus_rule": "sps"}, "greedy")  # exact with one-hot drafts
    config.check_request_spec({"cactus_rule": "frontier:delta=1"}, None)  # no speculation
    cases = [
        ({"cactus_rule": "cactus:delta=-1"}, "probabilistic", "delta: must be >= 0"),
        ({"cactus_rule": 7}, "probabilistic", "expected a rule spec string"),
        ({"cactus_rule": [1, 2]}, "probabilistic", "got list"),
        ({"cactus_rule": {"a": 1}}, "probabilistic", "got dict"),
        ({"cactus_rule": "os"}, "probabilistic", "unknown rule 'os'"),
        ({"cactus_rule": "nope"}, "probabilistic", "nope"),
        ({"cactus_rule": "cactus:delta=1"}, "greedy", "one-hot drafts"),
    ]
    for extra, method, says in cases:
        with pytest.raises(ValueError, match="vllm_xargs.cactus_rule") as error:
            config.check_request_spec(extra, method)
        assert says in str(error.value)


def test_the_input_processor_checks_the_engines_draft_method():
    from vllm import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    plugin.install()
    assert getattr(InputProcessor._validate_params, plugin.MARK)

    class Speculative:
        draft_sample_method = "greedy"

    class VllmConfig:
        speculative_config = Speculative()

    with pytest.raises(ValueError, match="delta"):
        bad = SamplingParams(extra_args={"cactus_rule": "cactus:delta=-2"})
        plugin.check_params(VllmConfig(), bad)
    with pytest.raises(ValueError, match="one-hot"):
        one_hot = SamplingParams(extra_args={"cactus_rule": "cactus:delta=1"})
        plugin.check_params(VllmConfig(), one_hot)
    plugin.check_params(VllmConfig(), SamplingParams(extra_args={"cactus_rule": "sps"}))
    plugin.check_params(VllmConfig(), SamplingParams())


def test_header_rule_resolves_as_the_engine_does():
    default = "cactus:delta=1.0"
    assert serve.header_rule({"prompt": "x"}, default, 1.0) == default
    assert serve.header_rule({"vllm_xargs": {"cactus_rule": "sps"}}, default, 1.0) == "sps"
    assert serve.header_rule({"vllm_xargs": {"cactus_rule": "vllm"}}, default, 1.0) == "vllm"
    assert serve.header_rule({"temperature": 0}, default, 1.0) == "vllm-greedy"
    assert serve.header_rule({}, default, 0.0) == "vllm-greedy"  # the model's default T
    assert serve.header_rule({"temperature": 0.5}, None, 1.0) == "vllm"  # no rule anywhere
    assert serve.header_rule({"vllm_xargs": {"cactus_rule": "bad:"}}, default, 1.0) is None
    assert serve.header_rule([1, 2], default, 1.0) is None
    # Unhashable values once raised TypeError inside the middleware (an ASGI traceback).
    for value in ([1, 2], {"rule": "sps"}, 3.5):
        assert serve.header_rule({"vllm_xargs": {"cactus_rule": value}}, default, 1.0) is None


def test_the_collector_exports_the_summaries_exactly():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    recorder = metrics.Recorder()
    recorder.add("cactus:delta=1.0", drafts=[3, 3, 2], accepted=[3, 1, 2], kl=[0.1, 0.25, 1 / 3])
    recorder.add("vllm", drafts=[3], accepted=[2], kl=None)
    snapshot = recorder.snapshot()
    collector = serve.CactusCollector()
    collector.update(snapshot)
    registry = CollectorRegistry()
    registry.register(collector)
    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            values[(sample.name, sample.labels["rule"])] = sample.value
    summary = snapshot["cactus:delta=1.0"]
    assert values[("cactus:spec_decode_num_steps_total", "cactus:delta=1.0")] == 3
    assert values[("cactus:spec_decode_num_accepted_tokens_total", "cactus:delta=1.0")] == 6
    assert values[("cactus:spec_decode_num_emitted_tokens_total", "cactus:delta=1.0")] == 9
    assert values[("cactus:spec_decode_kl_sum_total", "cactus:delta=1.0")] == summary["kl_sum"]
    assert values[("cactus:spec_decode_accepted_length", "cactus:delta=1.0")] == 2.0
    assert (
        values[("cactus:spec_decode_kl_per_token", "cactus:delta=1.0")] == (summary["kl_per_token"])
    )
    assert values[("cactus:spec_decode_accepted_length", "vllm")] == 2.0
    assert ("cactus:spec_decode_kl_per_token", "vllm") not in values  # not measured
    assert ("cactus:spec_decode_kl_sum_total", "vllm") not in values


def test_cactus_serve_prints_the_command_and_refuses_mistakes(capsys):
    words = ["serve", "/tmp", "/tmp", "--max-model-len", "512", "--rule", "sps", "-k", "4"]
    assert cli.main([*words, "--print-command"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[0] == "CACTUS_VLLM_RULE=sps"
    assert printed[2:4] == ["-m", serve.SERVER_MODULE]
    options = printed[4:]
    spec = options[options.index("--speculative-config") + 1]
    assert '"num_speculative_tokens": 4' in spec and '"probabilistic"' in spec
    assert options[options.index("--additional-config") + 1] == '{"cactus_rule": "sps"}'
    assert options[options.index("--worker-extension-cls") + 1] == metrics.EXTENSION
    assert options[options.index("--middleware") + 1] == serve.MIDDLEWARE
    assert options[options.index("--host") + 1] == "127.0.0.1"
    assert options[options.index("--shutdown-timeout") + 1] == "10"
    assert options[options.index("--max-model-len") + 1] == "512"
    assert "--rule" not in options and "-k" not in options
    for bad, says in (
        (["serve", "./missing-model", "/tmp"], "verifier: no such folder"),
        (["serve", "/tmp", "/tmp", "--rule", "cactus:delta=-1"], "delta"),
        (["serve", "/tmp", "/tmp", "-k", "0"], "k: must be at least 1"),
        (["serve", "/tmp", "/tmp", "--speculative-config", "{}"], "--speculative-config"),
    ):
        assert cli.main([*bad, "--print-command"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err


def test_executor_teardown_unlinks_the_ring_buffers_and_ignores_signals():
    from vllm.distributed.device_communicators.shm_broadcast import ShmRingBuffer

    buffer = ShmRingBuffer(1, 1024, 2)
    name = buffer.shared_memory.name
    assert os.path.exists(f"/dev/shm/{name}")

    class Queue:
        pass

    class Worker:
        worker_response_mq = None

    queue = Queue()
    queue.buffer = buffer
    executor = type("Executor", (), {})()
    executor.rpc_broadcast_mq, executor.workers, executor.response_mqs = queue, [Worker()], [queue]
    found = plugin.shm_buffers(executor)
    assert found == [buffer]
    plugin.unlink_buffers(found)
    assert not os.path.exists(f"/dev/shm/{name}") and not buffer.is_creator
    plugin.unlink_buffers(found)  # already gone: fine
    del buffer, found, queue, executor  # its finaliser must not unlink again (no error)

    before = signal.getsignal(signal.SIGTERM)
    with plugin.signals_ignored():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored
    assert signal.getsignal(signal.SIGTERM) == before
