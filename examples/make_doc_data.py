"""Build the document substrate's committed data: the sentence pool and the held-out pages.

    python examples/make_doc_data.py                 # docs_parse/bundled/text/docstrings.txt + pages_test/

The pool mixes two offline sources so pages carry more than one register of English: the project's
fortunes sentences (everyday prose; speech/bundled/sentences) and first sentences of the docstrings of
Python's standard library (technical prose, PSF licence), cleaned to ASCII words and light punctuation.
Training pages are rendered on the fly from the pool (mmspec.docs_parse.pages.render_page); only the
held-out pages are committed, as PNG + JSON.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
import warnings

from mmspec.docs_parse.pages import HELD_OUT_DIR, TEXT_POOL, write_held_out_set

STDLIB = ("argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "colorsys", "contextlib",
          "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions", "ftplib",
          "functools", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http", "imaplib", "inspect",
          "io", "ipaddress", "itertools", "json", "locale", "logging", "lzma", "mailbox", "mimetypes",
          "multiprocessing", "numbers", "operator", "optparse", "os", "pathlib", "pickle", "platform",
          "plistlib", "poplib", "pprint", "queue", "random", "re", "sched", "secrets", "selectors", "shelve",
          "shlex", "shutil", "signal", "smtplib", "socket", "sqlite3", "ssl", "statistics", "string",
          "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
          "trace", "traceback", "typing", "unittest", "urllib", "uuid", "warnings", "wave", "weakref",
          "xml", "zipfile", "zlib")
_CLEAN = re.compile(r"^[A-Za-z][A-Za-z ,']*[A-Za-z]$")


def docstring_sentences(min_words: int = 4, max_words: int = 16) -> list[str]:
    """First sentences of stdlib docstrings: letters, spaces, commas and apostrophes only, deduplicated."""
    seen, out = set(), []
    for name in STDLIB:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
        objects = [module] + [obj for _, obj in sorted(vars(module).items()) if not _.startswith("_")]
        for obj in objects:
            doc = inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj)
                                          or inspect.ismodule(obj)) else None
            if not doc:
                continue
            first = re.split(r"(?<=\.)\s", doc.strip().split("\n\n")[0].replace("\n", " "))[0].rstrip(".")
            if _CLEAN.match(first) and min_words <= len(first.split()) <= max_words:
                s = first[0].lower() + first[1:]
                if s not in seen:
                    seen.add(s)
                    out.append(s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-test-pages", type=int, default=64)
    parser.add_argument("--skip-pool", action="store_true", help="keep the committed sentence pool")
    args = parser.parse_args()
    if not args.skip_pool:
        docs = docstring_sentences()
        TEXT_POOL.parent.mkdir(parents=True, exist_ok=True)
        TEXT_POOL.write_text("\n".join(docs) + "\n")
        print(f"{len(docs)} docstring sentences -> {TEXT_POOL} (with the fortunes list: the text pool)")
    write_held_out_set(HELD_OUT_DIR, args.num_test_pages)
    print(f"{args.num_test_pages} held-out pages -> {HELD_OUT_DIR}")


if __name__ == "__main__":
    main()
