import pytest
import torch
from postgres import postgres_server  # noqa: F401  (a real PostgreSQL for the tests that ask for it)


@pytest.fixture(autouse=True, scope="session")
def _one_thread_session():
    """One intra-op thread for module- and session-scoped fixtures too (a NUTS reference fitted
    once per module, say): on a loaded 2-core machine two threads made such fits ten times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests run many tiny tensor ops: one intra-op thread (see bayes_safe.threads)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
