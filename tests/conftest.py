import os

import pytest
from hypothesis import HealthCheck, settings

# A fixed, derandomised profile in CI so failures reproduce; locally the default profile
# explores more. Deadlines are off: the shared CI machine is noisy and timing is not a test.
settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: one intra-op thread avoids oversubscribing CI's two cores (restored after)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
