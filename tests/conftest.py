import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests run many tiny tensor ops: one intra-op thread (see bayes_safe.threads)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
