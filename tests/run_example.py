"""Run a script of examples/ in-process as `python examples/SCRIPT ARGS...` (smoke tests of training scripts)."""

import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(script: str, args) -> None:
    old = sys.argv
    sys.argv = [str(EXAMPLES / script)] + [str(a) for a in args]
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    finally:
        sys.argv = old
