import pytest
import torch as th


@pytest.fixture(autouse=True)
def one_torch_thread():
    # Torch is several times faster with one thread on this 2-core machine, and tests must not fight for cores.
    th.set_num_threads(1)
