"""What `pip install .` installs holds every module and every file the package loads at run time.

The package list is discovered (setup.py) and the package data is every file under a `bundled/` folder
(pyproject.toml); this test builds the wheel (or reads the one `.ci/check_install` built, in
$MMSPEC_WHEEL_DIR) and compares it with the checkout: a package left out of discovery, a bundled file type the
data patterns miss, or a file loaded from outside `bundled/` fails here rather than on a user's machine."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mmspec

pytestmark = pytest.mark.e2e

ROOT = Path(mmspec.__file__).resolve().parent
OUTSIDE_PACKAGE = {"tests", "examples", "docs", "build", "dist", ".ci", ".git"}


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    given = os.environ.get("MMSPEC_WHEEL_DIR")
    wheels = sorted(Path(given).glob("mmspec-*.whl")) if given else []
    if not wheels:
        out = tmp_path_factory.mktemp("wheel")
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(ROOT), "-w", str(out)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        wheels = sorted(out.glob("mmspec-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as archive:
        return set(archive.namelist())


def package_files() -> list[Path]:
    """Every module of the package and every file under a `bundled/` folder in the checkout (git's view when
    this is a git checkout, so stray local files do not count)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [Path(name) for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file()]
    return [f for f in files if f.parts[0] not in OUTSIDE_PACKAGE and (f.suffix == ".py" or "bundled" in f.parts)]


def test_every_module_and_bundled_file_is_in_the_wheel(wheel_names):
    expected = {f"mmspec/{f.as_posix()}" for f in package_files() if f.as_posix() != "setup.py"}
    assert "mmspec/setup.py" not in wheel_names  # the packaging script is not a module of the package
    missing = sorted(expected - wheel_names)
    assert not missing, f"{len(missing)} files are not in the wheel, e.g. {missing[:5]}"
    assert "mmspec/plugins/ptp/plugin.py" in wheel_names  # the module whose absence first broke `pip install .`
    assert not [n for n in wheel_names if n.startswith(("mmspec/tests/", "mmspec/examples/", "tests/"))]


def test_every_declared_plugin_and_modality_module_is_in_the_wheel(wheel_names):
    from mmspec.common import registry

    modules = {s.module for s in registry.plugin_summaries() if s.module}
    modules |= {s.config.partition(":")[0] for s in registry.plugin_summaries() if s.config}
    modules |= set(registry._BUILTIN_MODULES)
    for module in sorted(modules):
        path = module.replace(".", "/")
        assert f"{path}.py" in wheel_names or f"{path}/__init__.py" in wheel_names, module


def test_files_opened_while_every_plugin_loads_are_in_the_wheel(wheel_names):
    """Every non-Python file under the package that loading each plugin on its default bundled model opens
    (configs, tokenizers, processors; an audit hook sees each open) is inside the wheel."""
    from mmspec import load_plugin
    from mmspec.common.registry import plugin_summaries

    opened = set()

    def record(event, args):
        if event == "open" and isinstance(args[0], (str, Path)):
            path = Path(args[0]).resolve()
            if path.is_relative_to(ROOT) and path.suffix not in (".py", ".pyc"):
                inside = path.relative_to(ROOT)
                if not inside.parts[0].endswith((".egg-info", ".dist-info")):  # an editable install's metadata
                    opened.add(f"mmspec/{inside.as_posix()}")

    sys.addaudithook(record)  # audit hooks cannot be removed: `opened` only grows while this test runs
    for summary in plugin_summaries():
        load_plugin(summary.name)
    frozen = set(opened)
    opened.clear()
    assert len(frozen) >= 10, sorted(frozen)  # the hook saw the loads (every bundled model has a config.json)
    assert not sorted(frozen - wheel_names), sorted(frozen - wheel_names)
