#!/usr/bin/python3
"""`pip install ./python` offline into a fresh virtual environment, then the installed package
(not the source tree) against real sidecars: its command line, its types (mypy, PEP 561), and
its examples landing a room between a prefill and a decode sidecar."""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "python"))

from processes import started, stop  # noqa: E402

TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
RUNFILES = os.getcwd()
KVRAIL = os.path.join(RUNFILES, "tools", "kvrail")
TMP = os.environ.get("TEST_TMPDIR", "/tmp")
SOURCE = os.path.join(TMP, "src", "python")
VENV = os.path.join(TMP, "src", "venv")  # the documented "venv", beside the copy
PYTHON = os.path.join(VENV, "bin", "python")
SHAPE = ["--tp", "1", "--layers", "2", "--pages", "64"]


def run(argv, cwd_override=None, env_extra=None, **kwargs):
    """argv from $TEST_TMPDIR (never the source tree, so nothing imports from there), with no
    PYTHONPATH (unless env_extra gives one); its completed process, output as text."""
    env = dict(os.environ, HOME=TMP, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    return subprocess.run(argv, cwd=cwd_override or TMP, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, **kwargs)


def documented_install():
    """The install commands of python/README.md's "Install" section, as written there: the
    indented lines of its first block."""
    with open(os.path.join(RUNFILES, "python", "README.md")) as readme:
        text = readme.read()
    section = text[text.index("## Install"):]
    lines = []
    for line in section.splitlines()[1:]:
        if line.startswith("    "):
            lines.append(line.strip())
        elif lines:
            break
    return lines


def tree(root):
    """Every path under `root`, for a before and after."""
    found = []
    for parent, dirs, files in os.walk(root):
        found.extend(os.path.join(parent, name) for name in dirs + files)
    return sorted(found)


class PythonPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Runfiles are symlinks (python/proto/... links into proto/ in git too): a plain copy,
        # made read-only (root writes anyway: the tree is compared before and after).
        shutil.rmtree(os.path.join(TMP, "src"), ignore_errors=True)
        shutil.copytree(os.path.join(RUNFILES, "python"), SOURCE, symlinks=False)
        for parent, dirs, files in os.walk(SOURCE):
            for name in dirs + files:
                os.chmod(os.path.join(parent, name), 0o555 if name in dirs else 0o444)
        os.chmod(SOURCE, 0o555)
        cls.source_before = tree(SOURCE)
        # The documented commands, as written, run from beside the copy ("./python", "venv").
        commands = documented_install()
        assert commands == [
            "/usr/bin/python3 -m venv --system-site-packages venv",
            "venv/bin/pip install --no-build-isolation --no-index ./python"], commands
        for command in commands:
            done = run(command.split(), cwd_override=os.path.dirname(SOURCE))
            assert done.returncode == 0, "%s:\n%s" % (command, done.stdout)
        cls.package = run([PYTHON, "-c", "import kvrail_engine, os; "
                           "print(os.path.dirname(kvrail_engine.__file__))"]).stdout.strip()
        print("kvrail_engine imports from %s" % cls.package, flush=True)

    def test_0a_the_install_wrote_nothing_into_the_tree_it_was_given(self):
        self.assertEqual(tree(SOURCE), self.source_before)

    def test_0b_a_python_without_pyzmq_is_named_in_one_line(self):
        # A venv of Debian's Python that does not see its packages: no wheel, pyzmq or protobuf.
        bare = os.path.join(TMP, "bare")
        shutil.rmtree(bare, ignore_errors=True)
        made = run(["/usr/bin/python3", "-m", "venv", "--without-pip", bare])
        self.assertEqual(made.returncode, 0, made.stdout)
        # Its install stops at the build's first step with the one line (pip from Debian's
        # Python, installing into the bare venv's interpreter's view: --python is pip 23.1+, so
        # the bare interpreter runs setup.py itself, as pip would).
        built = run([os.path.join(bare, "bin", "python"), "setup.py", "--name"],
                    cwd_override=SOURCE)
        self.assertNotEqual(built.returncode, 0, built.stdout)
        lines = [l for l in built.stdout.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, built.stdout)
        self.assertIn("kvrail-engine: this Python (%s" % os.path.join(bare, "bin", "python"),
                      lines[0])
        self.assertIn("lacks wheel, pyzmq, protobuf", lines[0])
        self.assertIn("/usr/bin/python3 -m venv --system-site-packages venv", lines[0])
        # And importing the package there says which Python to use, in its last line.
        imported = run([os.path.join(bare, "bin", "python"), "-c", "import kvrail_engine"],
                       env_extra={"PYTHONPATH": SOURCE, "PYTHONDONTWRITEBYTECODE": "1"})
        self.assertNotEqual(imported.returncode, 0)
        self.assertIn("ImportError: kvrail_engine: this Python (%s) lacks pyzmq, protobuf: use "
                      "Debian's /usr/bin/python3" % os.path.join(bare, "bin", "python"),
                      imported.stdout.strip().splitlines()[-1])
        self.assertEqual(tree(SOURCE), self.source_before)

    def test_1_it_imports_from_the_venv_with_its_generated_module_and_types(self):
        site = run([PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        self.assertEqual(self.package, os.path.join(site.stdout.strip(), "kvrail_engine"))
        self.assertTrue(self.package.startswith(VENV + "/"), self.package)
        for name in ("py.typed", "engine_pb2.py", "engine_pb2.pyi", "examples/engine_example.py",
                     "examples/reference_engine.py"):
            self.assertTrue(os.path.isfile(os.path.join(self.package, name)), name)
        generated = run([PYTHON, "-c", "import kvrail_engine.engine_pb2 as m; print(m.__file__); "
                         "from kvrail_engine.client import engine_pb2; print(engine_pb2 is m)"])
        self.assertEqual(generated.stdout.split(),
                         [os.path.join(self.package, "engine_pb2.py"), "True"])
        # kvrail_tokenspeed installs beside it, with the patch of tokenspeed it ships.
        tokenspeed = os.path.join(os.path.dirname(self.package), "kvrail_tokenspeed")
        for name in ("py.typed", "tokenspeed.patch", "executors.py", "hook.py"):
            self.assertTrue(os.path.isfile(os.path.join(tokenspeed, name)), name)
        # Built into the package, never written into the source tree pip was given.
        self.assertFalse(os.path.exists(os.path.join(SOURCE, "kvrail_engine", "engine_pb2.py")))

    def test_2_help_says_how_to_reach_a_sidecar(self):
        for argv in ([PYTHON, "-m", "kvrail_engine", "--help"],
                     [os.path.join(VENV, "bin", "kvrail-engine"), "--help"]):
            shown = run(argv)
            self.assertEqual(shown.returncode, 0, shown.stdout)
            for words in ("--engine-endpoint", "ipc://", "tcp://", "kvrail sidecar", "ping",
                          "poll", "--curve-key", "--curve-server-key"):
                self.assertIn(words, shown.stdout)

    def test_3_no_sidecar_there_is_one_line_and_exit_1(self):
        gone = run([PYTHON, "-m", "kvrail_engine", "ping", "ipc://%s/none.sock" % TMP])
        self.assertEqual((gone.returncode, gone.stdout.count("\n")), (1, 1), gone.stdout)
        self.assertIn("no socket at %s/none.sock" % TMP, gone.stdout)
        silent = run([PYTHON, "-m", "kvrail_engine", "ping", "tcp://127.0.0.1:%d" % free_port(),
                      "--timeout", "0.5"])
        self.assertEqual(silent.returncode, 1, silent.stdout)
        self.assertIn("no reply within 0.5 s", silent.stdout)
        bad = run([PYTHON, "-m", "kvrail_engine", "ping", "localhost:5"])
        self.assertEqual(bad.returncode, 2, bad.stdout)
        self.assertIn("'localhost:5': an engine endpoint is ipc://PATH or tcp://HOST:PORT",
                      bad.stdout)

    def test_4_mypy_checks_the_installed_package_and_its_users(self):
        config = ["--config-file", os.path.join(SOURCE, "pyproject.toml"),
                  "--python-executable", PYTHON, "--cache-dir", os.path.join(TMP, "mypy")]
        package = run(["/usr/bin/python3", "-m", "mypy"] + config + ["-p", "kvrail_engine",
                                                                      "-p", "kvrail_tokenspeed"])
        self.assertEqual(package.returncode, 0, package.stdout)
        # PEP 561: a program of the engine's sees the package's types from the venv.
        user = os.path.join(TMP, "engine_rank.py")
        with open(user, "w") as f:
            f.write("from kvrail_engine import SidecarClient\n"
                    "client = SidecarClient('ipc:///tmp/x.sock')\n"
                    "client.attach_allocated('many bytes', '{}')\n")
        typed = run(["/usr/bin/python3", "-m", "mypy"] + config + [user])
        self.assertEqual(typed.returncode, 1, typed.stdout)
        self.assertIn('Argument 1 to "attach_allocated" of "SidecarClient" has incompatible '
                      'type "str"; expected "int"', typed.stdout)

    def test_5_the_installed_examples_land_a_room_and_ping_sees_it(self):
        processes = []
        try:
            address = start_bootstrap(processes)
            contract = os.path.join(TMP, "contract.json")
            with open(contract, "w") as f:
                f.write(subprocess.check_output([KVRAIL, "contract"] + SHAPE, text=True))
            arena = subprocess.check_output([KVRAIL, "contract", "--arena-bytes"] + SHAPE,
                                            text=True).strip()
            with open(contract) as f:
                group = json.load(f)["plan"]["groups"][0]["group_id"]
            manifest = os.path.join(TMP, "manifest.json")
            with open(manifest, "w") as f:  # 40 tokens: 3 pages of 16
                json.dump({"groups": [{"group_id": group, "block_ids": [4, 5, 6]}],
                           "prefix_len": 0, "prompt_len": 40}, f)
            endpoints, pids = {}, {}
            for role, extra in (("prefill", ["--bootstrap", address]), ("decode", [])):
                endpoints[role] = "ipc:///tmp/kvrail-pkgtest-%s-%s.sock" % (TAG, role)
                sidecar, _ = started([KVRAIL, "sidecar", "--role", role, "--engine-endpoint",
                                      endpoints[role], "--host", "127.0.0.1", "--tls", "tcp",
                                      "--verify-digest"] + extra, "sidecar ready")
                processes.append(sidecar)
                pids[role] = sidecar.pid
            # The prefill rank: the reference engine, serving room 1 in the decode's window.
            prefill, _ = started([PYTHON, "-m", "kvrail_engine.examples.reference_engine",
                                  "--role", "prefill", "--sidecar", endpoints["prefill"],
                                  "--contract", contract, "--arena-bytes", arena, "--rooms",
                                  "1", "--timeout", "60"], "attached")
            processes.append(prefill)
            decode = run([PYTHON, "-m", "kvrail_engine.examples.engine_example", "--sidecar",
                          endpoints["decode"], "--arena-bytes", arena, "--contract", contract,
                          "--bootstrap", address, "--manifest", manifest, "--room", "1"])
            self.assertEqual(decode.returncode, 0, decode.stdout)
            # Success with --verify-digest: the landed bytes' digest matched the prefill's.
            # The token is reference_engine's first_token(1).
            self.assertRegex(decode.stdout, r"room 1 landed: \d+ bytes, bootstrap token 7919")
            out, _ = prefill.communicate(timeout=60)
            self.assertEqual(prefill.returncode, 0, out)
            self.assertIn("done 1 ok", out)
            ping = run([PYTHON, "-m", "kvrail_engine", "ping", endpoints["decode"]])
            self.assertEqual(ping.returncode, 0, ping.stdout)
            # Who answered: its role, rank and pid.
            self.assertRegex(ping.stdout, r"^sidecar ipc://\S+ answered in [0-9.]+ ms: decode "
                             r"rank 0 of 1, pid %d; engines \d+, rooms \d+ \(succeeded 1, "
                             r"failed 0\)" % pids["decode"])
        finally:
            stop(processes)

    def test_6_curve_on_a_tcp_engine_api(self):
        keys, allowed = os.path.join(TMP, "keys"), os.path.join(TMP, "allowed")
        os.makedirs(allowed, exist_ok=True)
        os.makedirs(keys, exist_ok=True)
        for role in ("decode", "engine"):
            subprocess.check_output([KVRAIL, "keygen", "--role", role, "--rank", "0", "--out",
                                     keys])
        shutil.copy(os.path.join(keys, "engine-0.pub"), allowed)
        sidecar, line = started([KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint",
                                 "tcp://127.0.0.1:0", "--host", "127.0.0.1", "--tls", "tcp",
                                 "--curve-key", os.path.join(keys, "decode-0.key"),
                                 "--curve-allowed", allowed], "sidecar ready")
        try:
            endpoint = line.split("engine=")[1].split()[0]
            server = ["--curve-server-key", os.path.join(keys, "decode-0.pub")]
            admitted = run([PYTHON, "-m", "kvrail_engine", "stats", endpoint, "--curve-key",
                            os.path.join(keys, "engine-0.key")] + server)
            self.assertEqual(admitted.returncode, 0, admitted.stdout)
            self.assertEqual(json.loads(admitted.stdout)["rooms"], 0)
            # A key the sidecar does not list: no answer, said in one line.
            stranger = run([PYTHON, "-m", "kvrail_engine", "ping", endpoint, "--timeout", "1",
                            "--curve-key", os.path.join(keys, "decode-0.key")] + server)
            self.assertEqual(stranger.returncode, 1, stranger.stdout)
            self.assertIn("a CURVE sidecar answers only the --curve-key clients it admits",
                          stranger.stdout)
            public = run([PYTHON, "-m", "kvrail_engine", "ping", endpoint, "--curve-key",
                          os.path.join(keys, "engine-0.pub")] + server)
            self.assertEqual(public.returncode, 1, public.stdout)
            self.assertIn("engine-0.pub: no \"secret\"", public.stdout)
        finally:
            stop([sidecar])

    def test_7_the_arena_layout_example_writes_and_checks_a_head_sliced_room(self):
        # docs/INTEGRATING.md, "Arena layout for engine authors": P=2 -> D=1 over tcp, with
        # --verify-digest, written and checked with numpy by the installed example.
        processes = []
        try:
            address = start_bootstrap(processes)
            shape = ["--layers", "2", "--pages", "16"]
            files = {}
            for role, tp in (("prefill", "2"), ("decode", "1")):
                files[role] = os.path.join(TMP, "layout-%s.json" % role)
                with open(files[role], "w") as f:
                    f.write(subprocess.check_output([KVRAIL, "contract", "--tp", tp] + shape,
                                                    text=True))
                files[role + "-bytes"] = subprocess.check_output(
                    [KVRAIL, "contract", "--arena-bytes", "--tp", tp] + shape, text=True).strip()
            endpoints = []
            for rank in (0, 1):
                endpoints.append("ipc:///tmp/kvrail-pkgtest-%s-layout-p%d.sock" % (TAG, rank))
                sidecar, _ = started([KVRAIL, "sidecar", "--role", "prefill", "--engine-endpoint",
                                      endpoints[-1], "--host", "127.0.0.1", "--tls", "tcp",
                                      "--tp-size", "2", "--tp-rank", str(rank), "--bootstrap",
                                      address, "--verify-digest"], "sidecar ready")
                processes.append(sidecar)
            decode_endpoint = "ipc:///tmp/kvrail-pkgtest-%s-layout-d0.sock" % TAG
            sidecar, _ = started([KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint",
                                  decode_endpoint, "--host", "127.0.0.1", "--tls", "tcp",
                                  "--verify-digest"], "sidecar ready")
            processes.append(sidecar)
            example = run([PYTHON, "-m", "kvrail_engine.examples.arena_layout", "--bootstrap",
                           address, "--prefill", endpoints[0], "--prefill", endpoints[1],
                           "--prefill-contract", files["prefill"], "--prefill-arena-bytes",
                           files["prefill-bytes"], "--decode", decode_endpoint,
                           "--decode-contract", files["decode"], "--decode-arena-bytes",
                           files["decode-bytes"]])
            self.assertEqual(example.returncode, 0, example.stdout)
            self.assertIn("every head of every page of the window checked", example.stdout)
        finally:
            stop(processes)


def start_bootstrap(processes):
    """A bootstrap server on a free port, appended to `processes`; its host:port."""
    bootstrap, line = started([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                              "bootstrap ready")
    processes.append(bootstrap)
    return "127.0.0.1:%s" % line.split("port=")[1].split()[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
