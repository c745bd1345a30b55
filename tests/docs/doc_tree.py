"""What the doc checks share: the source tree they read, its files, and markdown's code spans.

doc_links_test.py (citations and relative links) and doc_claims_test.py (paths, flags and
defaults) both read the source tree the runfile README.md links to, because what they check
(every tracked file, every package's sources) is more than any data dependency can list.
"""

import os
import re
import subprocess
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def source_root():
    """ROOT from the command line, else the source tree of the runfile README.md."""
    if len(sys.argv) > 1:
        return os.path.abspath(sys.argv[1])
    runfiles = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE", "kvrail")
    if not runfiles:
        return os.getcwd()
    readme = os.path.join(runfiles, workspace, "README.md")
    return os.path.dirname(os.path.realpath(readme))


def tracked_files(root):
    """The files `git ls-files` lists, or outside a checkout every file but bazel-* and hidden."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        return sorted(p for p in out.decode("utf-8").split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        files = []
        for top, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-"))]
            for name in names:
                files.append(os.path.relpath(os.path.join(top, name), root))
        return sorted(files)


def read_lines(root, path):
    try:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def prose_lines(lines):
    """(line number, text) of the lines outside fenced code blocks."""
    for number, line, fenced in all_lines(lines):
        if not fenced:
            yield number, line


def all_lines(lines):
    """(line number, text, fenced) of every line but the fences themselves."""
    fenced = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        yield number, line, fenced
