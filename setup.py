"""The one piece of packaging pyproject.toml cannot say: the repository root is the package `mmspec`
(`package-dir` in pyproject.toml), so its sub-packages are found here and named under it. Discovery, not a
hand-kept list: a new plugin or modality folder with an `__init__.py` ships without an edit here. tests/ and
examples/ have no `__init__.py` (DESIGN.md) and are excluded by name as well."""

from setuptools import find_packages, setup

SUBPACKAGES = find_packages(where=".", exclude=("tests", "tests.*", "examples", "examples.*", "build", "build.*"))

setup(packages=["mmspec", *(f"mmspec.{name}" for name in SUBPACKAGES)])
