import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BASH_KERNEL, JS_KERNEL, PYTHON_KERNEL, Kernel  # noqa: E402


def started(argv, **kwargs):
    kernel = Kernel(argv, **kwargs)
    kernel.ready = kernel.wait_ready()
    return kernel


# One kernel per test module for the tests that only add state; tests that interrupt,
# hang up or need a special environment start their own.


@pytest.fixture(scope="module")
def python_kernel():
    kernel = started(PYTHON_KERNEL)
    yield kernel
    kernel.kill()


@pytest.fixture(scope="module")
def js_kernel():
    kernel = started(JS_KERNEL)
    yield kernel
    kernel.kill()


@pytest.fixture(scope="module")
def bash_kernel():
    kernel = started(BASH_KERNEL)
    yield kernel
    kernel.kill()


@pytest.fixture
def fresh_kernel():
    """Starts kernels for one test and kills whatever is left of them afterwards."""
    kernels = []

    def start(argv, **kwargs):
        kernel = started(argv, **kwargs)
        kernels.append(kernel)
        return kernel

    yield start
    for kernel in kernels:
        kernel.kill()
