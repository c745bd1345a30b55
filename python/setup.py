"""Builds kvrail_engine with its generated engine API module built in.

Everything declarative is in pyproject.toml; this file only adds the build step that compiles
proto/kvrail/v1/engine.proto (a symlink to the repository's proto/, so that the one .proto is
what pip sees from ./python) into kvrail_engine/engine_pb2.py and engine_pb2.pyi, with protoc
(Debian's protobuf-compiler, or $PROTOC), straight into the build tree, which is a temporary
directory: nothing is written to the source tree, which may be read-only. A Python that lacks
what the offline install needs stops it with one line naming the Python to use.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile


def check_python() -> None:
    """One line, naming the Python to use, when this one cannot build or run the package: the
    offline install (--no-build-isolation --no-index) fetches nothing, so what it needs must be
    this Python's already (Debian's python3-wheel, python3-zmq, python3-protobuf)."""
    missing = []
    for module, package in (("wheel", "wheel"), ("zmq", "pyzmq"), ("google.protobuf", "protobuf")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        which = sys.executable
        if sys.prefix != sys.base_prefix:  # a virtual environment: name the Python it was made from
            which += ", a virtual environment of " + getattr(sys, "_base_executable", sys.base_prefix)
        sys.exit("kvrail-engine: this Python (%s; %d.%d) lacks %s, and an offline install "
                 "fetches nothing: use Debian's, /usr/bin/python3 -m venv --system-site-packages "
                 "venv && venv/bin/pip install --no-build-isolation --no-index ./python"
                 % (which, sys.version_info[0], sys.version_info[1], ", ".join(missing)))


check_python()

from setuptools import setup  # noqa: E402
from setuptools.command.build_py import build_py  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "proto")
PROTO = "kvrail/v1/engine.proto"


def protoc() -> str:
    found = os.environ.get("PROTOC") or shutil.which("protoc")
    if not found:
        sys.exit("kvrail-engine setup.py: protoc not found on PATH (install Debian's "
                 "protobuf-compiler, or set PROTOC): it generates kvrail_engine/engine_pb2.py "
                 "from " + PROTO)
    return found


def generate(package_dir: str) -> None:
    """engine_pb2.py and engine_pb2.pyi from the proto, into `package_dir`."""
    if not os.path.isfile(os.path.join(PROTO_ROOT, PROTO)):
        sys.exit("kvrail-engine setup.py: %s is missing (python/proto/%s links to the "
                 "repository's proto/; copy the tree with its links followed, cp -rL)"
                 % (os.path.join(PROTO_ROOT, PROTO), PROTO))
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([protoc(), "--proto_path=" + PROTO_ROOT, "--python_out=" + out,
                        "--pyi_out=" + out, PROTO], check=True)
        os.makedirs(package_dir, exist_ok=True)
        for name in ("engine_pb2.py", "engine_pb2.pyi"):
            shutil.copyfile(os.path.join(out, "kvrail", "v1", name),
                            os.path.join(package_dir, name))


class BuildPyWithProto(build_py):
    def run(self) -> None:
        super().run()
        if not self.dry_run:
            generate(os.path.join(self.build_lib, "kvrail_engine"))


# Nothing is written into the tree pip was given (it may be a read-only checkout): the build tree
# and the egg-info go to a temporary directory of this run.
OUT_OF_TREE = tempfile.mkdtemp(prefix="kvrail-engine-build-")
atexit.register(shutil.rmtree, OUT_OF_TREE, True)

setup(cmdclass={"build_py": BuildPyWithProto},
      options={"build": {"build_base": OUT_OF_TREE}, "egg_info": {"egg_base": OUT_OF_TREE}})
