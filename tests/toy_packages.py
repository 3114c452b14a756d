"""Installing a small third-party package for a test: real entry points, in a private --target folder."""

import subprocess
import sys
import textwrap


def install_package(tmp_path_factory, name: str, files: dict[str, str]):
    """Write `files` (file name -> text, a pyproject.toml among them) as a package, pip-install it into a
    fresh folder without touching the environment, and return that folder (prepend it to sys.path)."""
    pkg = tmp_path_factory.mktemp(f"{name}_pkg")
    for filename, text in files.items():
        (pkg / filename).write_text(textwrap.dedent(text) if filename.endswith(".toml") else text)
    site = tmp_path_factory.mktemp(f"{name}_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--target", str(site), str(pkg)], check=True)
    return site
