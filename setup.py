"""The one piece of packaging pyproject.toml cannot say: the repository root is the package `mmspec`
(`package-dir` in pyproject.toml), so its sub-packages are found here and named under it. Discovery, not a
hand-kept list: a new plugin or modality folder with an `__init__.py` ships without an edit here. tests/ and
examples/ have no `__init__.py` (DESIGN.md) and are excluded by name as well."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

SUBPACKAGES = find_packages(where=".", exclude=("tests", "tests.*", "examples", "examples.*", "build", "build.*"))


class BuildPy(build_py):
    """This file sits in the package's folder: keep it out of the package (a PEP 517 build does not skip it)."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("mmspec", "setup")]


setup(packages=["mmspec", *(f"mmspec.{name}" for name in SUBPACKAGES)], cmdclass={"build_py": BuildPy})
