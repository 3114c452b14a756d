import os

# Triton decides between compiling and interpreting when a kernel is decorated, so this must come
# before anything imports mmspec's kernels.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Decodes run the acceptance kernels' torch references: under the Triton interpreter each kernel launch costs
# milliseconds on a CPU (the suite took 870 s with it, 584 s without, on 2 cores). The Triton path is tested
# on purpose where a test sets MMSPEC_KERNELS=triton: each kernel against its reference (test_kernels.py and
# the plugins' kernel tests) and one end-to-end decode per kernel (test_triton_decodes.py).
os.environ.setdefault("MMSPEC_KERNELS", "torch")

import pytest  # noqa: E402


from tiny_models import perturbed_copy, tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair():
    target = tiny_llama(vocab_size=64, layers=2, seed=0)
    draft = perturbed_copy(target, noise=0.3)
    return target, draft


@pytest.fixture
def torch_kernels(monkeypatch):
    """Run acceptance on the torch reference (the suite's default already; kept where a test must not depend on
    how it is run)."""
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")


@pytest.fixture(scope="module")
def torch_kernels_module():
    """Module-wide torch kernels, for modules that run thousands of decode steps (use via pytestmark)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MMSPEC_KERNELS", "torch")
    yield
    patch.undo()


def pytest_collection_modifyitems(config, items):
    """`law`: every test whose name says law (the sampling-law tests and their planted-bias companions)."""
    for item in items:
        if "law" in item.name.split("[")[0]:
            item.add_marker(pytest.mark.law)
