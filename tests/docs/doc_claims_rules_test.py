#!/usr/bin/env python3
"""The rules of doc_claims_test.py, each on a line a doc could hold and a --help CLI11 prints."""

import os
import tempfile
import unittest

import doc_claims_test as claims


def write_tree(root, files):
    """Writes each {relative path: text} under root, making its folders."""
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)

SIDECAR_HELP = """Serve one engine rank
Usage: kvrail sidecar [OPTIONS]

Options:
  -h,--help                   Print this help message and exit
  --role TEXT:{prefill,decode} REQUIRED
                              prefill or decode
  --engine-endpoint TEXT REQUIRED
                              Where the engine connects
  --handshake-timeout FLOAT=5 Prefill: seconds a decode's descriptor fetch may take
  --fence-wait FLOAT=10       Decode: seconds a failed room's pages wait
  --max-body-bytes UINT:UINT in [1 - 1073741824]=1048576
                              Bytes
  --metrics-port INT:INT in [0 - 65535]
                              Serve GET /metrics on this port (default: off)
  --verify-digest             Prefill: send kvrail decodes a digest
  --populate-arena,--no-populate-arena{false}
                              Populate the arena at attach
"""


def commands():
    options, _ = claims.parse_help(SIDECAR_HELP)
    return {(): {}, ("sidecar",): options}


class HelpParsing(unittest.TestCase):
    def test_an_option_has_the_default_after_its_type(self):
        options, _ = claims.parse_help(SIDECAR_HELP)
        self.assertEqual(options["--handshake-timeout"].default, "5")
        self.assertEqual(options["--max-body-bytes"].default, "1048576")

    def test_a_required_option_has_no_default(self):
        options, _ = claims.parse_help(SIDECAR_HELP)
        self.assertTrue(options["--engine-endpoint"].required)
        self.assertIsNone(options["--engine-endpoint"].default)

    def test_a_flag_is_boolean_and_both_names_of_a_pair_are_known(self):
        options, _ = claims.parse_help(SIDECAR_HELP)
        self.assertTrue(options["--verify-digest"].boolean)
        self.assertIn("--no-populate-arena", options)

    def test_a_default_in_the_description_counts(self):
        options, _ = claims.parse_help(SIDECAR_HELP)
        self.assertEqual(claims.help_default(options["--metrics-port"]), "off")


class Defaults(unittest.TestCase):
    def errors(self, line, following=""):
        return claims.check_defaults(commands(), line, following, set())

    def test_a_default_the_help_states_passes_in_every_form(self):
        for line in ["`--fence-wait` (decode, 10 s: how long held pages wait)",
                     "`--fence-wait` (10 s by default)",
                     "past `--fence-wait`, 10 s by default)",
                     "`--max-body-bytes` (1 MiB)",
                     "`--metrics-port N` (default: off)",
                     "`--verify-digest` (both roles, off by default)"]:
            self.assertEqual(self.errors(line), [], line)

    def test_a_wrong_default_is_reported_with_what_the_help_says(self):
        self.assertEqual(self.errors("`--fence-wait` (decode, 30 s: how long)"),
                         ["says --fence-wait defaults to 30 s, but `kvrail sidecar --help` "
                          "says 10"])

    def test_a_default_for_a_required_option_is_reported(self):
        errors = self.errors("(`--engine-endpoint`, `ipc:///tmp/x.sock` by", "default)")
        self.assertEqual(len(errors), 1)
        self.assertIn("marks it REQUIRED", errors[0])

    def test_words_that_state_no_default_are_not_a_claim(self):
        self.assertEqual(self.errors("`--fence-wait` (see ENGINE-API.md)"), [])


class Flags(unittest.TestCase):
    def test_a_flag_after_a_command_belongs_to_that_command(self):
        found, errors = claims.flags_in_segment(commands(), "kvrail sidecar --role x --foo 1")
        self.assertEqual(found, [("--role", ("sidecar",)), ("--foo", ("sidecar",))])
        self.assertEqual(errors, [])
        self.assertFalse(claims.has_flag(commands(), ("sidecar",), "--foo"))

    def test_another_programs_flags_are_not_kvrails(self):
        found, _ = claims.flags_in_segment(commands(), "bazel test --config=asan //...")
        self.assertEqual(found, [])

    def test_a_command_kvrail_does_not_have_is_reported(self):
        _, errors = claims.flags_in_segment(commands(), "kvrail soak --minutes 2")
        self.assertEqual(errors, ["names `kvrail soak`, which `kvrail --help` does not list"])


class SectionCitations(unittest.TestCase):
    def test_a_title_the_doc_does_not_contain_is_reported(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, {
                "docs/A.md": "# A\n\n- **Failed means\n  fenced.** text\n",
                "x.cc": '// (docs/A.md, "Failed means fenced")\n// (docs/A.md, "Isolation")\n',
            })
            errors, checked = claims.check_section_citations(
                root, ["docs/A.md", "x.cc"], {"A.md": "docs/A.md"})
        self.assertEqual(checked, 2)
        self.assertEqual(errors, ['x.cc:2: cites A.md, "Isolation", which docs/A.md does not '
                                  'contain'])


class Targets(unittest.TestCase):
    def test_a_target_a_macro_defines_besides_its_name_is_known_and_no_other(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, {
                "fz/BUILD.bazel": 'kvrail_fuzz_test(\n    name = "wire_fuzz",\n)\n',
            })
            self.assertIsNone(claims.check_target(root, "fz", "wire_fuzz"))
            self.assertIsNone(claims.check_target(root, "fz", "wire_fuzz_libfuzzer"))
            self.assertIsNone(claims.check_target(root, "fz", "wire_fuzz_harness"))
            self.assertEqual(claims.check_target(root, "fz", "plan_fuzz_libfuzzer"),
                             "names //fz:plan_fuzz_libfuzzer, which fz/BUILD.bazel does not "
                             "define")


if __name__ == "__main__":
    unittest.main()
