"""One torch thread for these tests: tiny models on a shared 2-core machine run many times
faster single-threaded than with OpenMP threads competing for the cores."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
