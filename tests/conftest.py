import os

# Triton decides between compiling and interpreting when a kernel is decorated, so this must come
# before anything imports mmspec's kernels.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


from tiny_models import perturbed_copy, tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair():
    target = tiny_llama(vocab_size=64, layers=2, seed=0)
    draft = perturbed_copy(target, noise=0.3)
    return target, draft


@pytest.fixture
def torch_kernels(monkeypatch):
    """Run acceptance on the torch reference (the Triton interpreter is too slow for 10^4-row tests)."""
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")


@pytest.fixture(scope="module")
def torch_kernels_module():
    """Module-wide torch kernels, for modules that run thousands of decode steps (use via pytestmark)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MMSPEC_KERNELS", "torch")
    yield
    patch.undo()
