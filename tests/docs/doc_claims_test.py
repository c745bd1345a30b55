#!/usr/bin/env python3
"""Every path, kvrail command, flag and flag default a doc names is what the tree and the binary say.

The project's .md files (docs/, README.md, BENCHMARKS.md and the others `git ls-files` lists,
but third_party/) are read line by line. This check fails when a doc
  * names a repository path (`control/sidecar/sidecar.h`, `tests/chaos/`, a glob such as
    `proto/kvrail/v1/*.proto`, `README.md:25`) that does not exist, or a document by its bare
    name (`FAILURE-MODEL.md`) that no tracked file is called;
  * names a Bazel target (`//tools:kvrail`, `tests/docs:doc_links_test`) whose package has no
    BUILD file or whose BUILD file does not mention the name;
  * names a kvrail command (`kvrail soak`) that `kvrail --help` does not list;
  * names a `--flag` for a kvrail command (`kvrail sidecar --role prefill --foo`, in a code span
    or a code block) that the command's `--help` does not have, or a `--flag` on its own that no
    kvrail command's `--help` has (flags of other programs are skipped where the code names the
    program: `bazel test --config=asan`, `pip install --no-index`);
  * states a flag's default in one of the forms the docs use ("`--fence-wait` (decode, 10 s",
    "`--registration-ttl` (60 s)", "(default 64)", "(default: off)", "`auto` by default",
    "`--backend ucx` (the default") that differs from the default its `--help` states, or
    states one for a flag its `--help` marks REQUIRED.
  * cites a section of a doc by its title, in a doc or in any tracked source
    (`docs/ARCHITECTURE.md, "Failed means fenced"`), and that doc does not contain the title.
Relative markdown links and protocol citations are doc_links_test's.

Usage: doc_claims_test.py [ROOT [KVRAIL]]. Without ROOT (under Bazel) the root is the source
tree that the runfile README.md links to; KVRAIL is the kvrail binary (default: the runfile
tools/kvrail, else ROOT/bazel-bin/tools/kvrail).
"""

import glob
import os
import re
import subprocess
import sys

from doc_tree import CODE_SPAN, all_lines, read_lines, source_root, tracked_files

# Programs other than kvrail whose flags the docs show: a code span or code-block line that
# starts with one of these is not checked for flags (it still is for paths).
OTHER_PROGRAMS = ("bazel", "bazel-bin/bench/", "pip", "pip3", "python3", "/usr/bin/python3",
                  "tools/run", "tools/lint", "tools/fuzz", "ucx_perftest", "ucx_info", "etcd",
                  "etcdctl", "docker", "podman", "systemctl", "systemd-analyze", "useradd",
                  "ip", "sudo ip", "git", "clang", "clang-tidy", "perf", "sysctl", "ulimit",
                  "tmux", "prometheus", "curl", "apt-get", "ibv_devinfo", "rdma", "nvidia-smi",
                  "ln", "install", "mkdir", "timeout", "taskset", "env", "cmake")
# Flags of other programs that the docs also name on their own, in prose, with the program
# named in words nearby.
OTHER_FLAGS = {
    "--no-build-isolation": "pip",
    "--no-index": "pip",
    "--system-site-packages": "python3 -m venv",
    "--test_output": "bazel",
    "--nocache": "docker",
    "--symlink": "tools/run",
    "--tidy": "tools/lint",
    "--ulimit": "docker",
    "--no-create-home": "useradd",
    "--system": "useradd",
    "--now": "systemctl",
    "--listen-peer-urls": "etcd",
    "--listen-client-urls": "etcd",
    "--advertise-client-urls": "etcd",
    "--initial-advertise-peer-urls": "etcd",
    "--initial-cluster": "etcd",
    "--data-dir": "etcd",
    "--network": "docker run",
    "--ipc": "docker run",
    "--device": "docker run",
    "--dry-run": "bench/gpu/check",
    "--disaggregation-mode": "tokenspeed",
    "--disaggregation-transfer-backend": "tokenspeed",
    "--disaggregation-bootstrap-port": "tokenspeed",
    "--disaggregation-ib-device": "tokenspeed",
    "--disaggregation-layerwise-interval": "tokenspeed",
    "--dist-init-addr": "tokenspeed",
}
# Documents the docs name that live outside this tree, and where they are.
EXTERNAL_DOCS = {
    "CACHEPD.md": "the CachePD specification the code was written from (docs/PROTOCOL.md)",
}
# Files whose flags are another program's: the Python client's command line.
FLAGS_NOT_KVRAIL = ("python/README.md",)
# Records of earlier sessions keep their commands as they were run: flags renamed since are
# accepted there, in a doc that says "`<flag>` was renamed".
HISTORY_DOCS = {"docs/benchmarks-history.md": ("--transport",)}
SKIPPED_DIRS = ("third_party/",)

KVRAIL_COMMAND = re.compile(r"(?:^|(?<=[\s/(`]))kvrail((?:\s+[a-z][a-z0-9-]*){1,2})")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*)")
FLAG_SPAN = re.compile(r"`(--[a-z][a-z0-9-]*)(?:[ =]([^`]*))?`")
COMMAND_LINE = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*(?:\S*/)?kvrail\s")
SHELL_BREAK = re.compile(r"\s(?:\|\s|&&|;|#)|\s>\s")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
PATH = re.compile(r"(?<![\w./@:~$<>-])((?:[A-Za-z0-9_.+-]+/)+[A-Za-z0-9_.*+@-]*)"
                  r"(?::([A-Za-z0-9_][A-Za-z0-9_.+-]*))?")
LABEL = re.compile(r"(?<![\w/:])//([A-Za-z0-9_./-]*)(?::([A-Za-z0-9_.+-]+))?")
BARE_DOC = re.compile(r"(?<![\w./-])([A-Z][A-Za-z0-9_-]*\.md)\b")
SECTION_CITATION = re.compile(r"\b([A-Z][A-Za-z0-9-]*\.md),? \"([^\"]{3,})\"")
CITING_SUFFIXES = (".cc", ".h", ".py", ".proto", ".md", ".sh", ".bzl", ".bazel", ".toml")
HELP_OPTION = re.compile(r"^  (-\S+)(.*)$")
# What CLI11 prints after an option's names: its type (an upper-case word, a range, choices),
# "=DEFAULT", " ..." for a list, " REQUIRED"; then the description, or nothing for a flag.
OPTION_SPEC = re.compile(r"^ (?P<spec>[A-Z]\S*(?: in \[[^\]]*\](?:=\S+)?)?(?: \.\.\.)?"
                         r"(?: REQUIRED)?)(?:\s+(?P<desc>.*))?$")
ROLES = re.compile(r"^(?:(?:prefill|decode|both roles|bootstrap|sidecar|bootstrap and sidecar|"
                   r"prefill and decode|both|each)\s*,\s*)+")
NUMBER_UNIT = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|min|KiB|MiB|GiB|B|bytes)?$")
UNITS = {None: 1, "ms": 1e-3, "s": 1, "min": 60, "B": 1, "bytes": 1, "KiB": 1 << 10,
         "MiB": 1 << 20, "GiB": 1 << 30}


class Option:
    def __init__(self, names, default, required, boolean, text):
        self.names = names
        self.default = default  # as the help states it, or None
        self.required = required
        self.boolean = boolean
        self.text = text  # the help's description


def parse_help(text):
    """(options by name, subcommand names) of one `--help` text from CLI11."""
    options, subcommands, section, current = {}, [], None, None
    for line in text.splitlines():
        if line in ("Options:", "Subcommands:", "Positionals:"):
            section, current = line, None
            continue
        if section == "Subcommands:":
            match = re.match(r"^  (\S+)", line)
            if match:
                subcommands.append(match.group(1))
            continue
        if section != "Options:":
            continue
        match = HELP_OPTION.match(line)
        if match:
            rest = match.group(2)
            spec_match = OPTION_SPEC.match(rest)
            spec = spec_match.group("spec") if spec_match else ""
            description = (spec_match.group("desc") if spec_match else rest) or ""
            names = [re.sub(r"\{.*\}$", "", n) for n in match.group(1).split(",")]
            names = [n for n in names if n.startswith("--")]
            default = re.search(r"=(\S+)", spec)
            current = Option(names, default.group(1) if default else None, "REQUIRED" in spec,
                             spec == "", description.strip())
            for name in names:
                options[name] = current
        elif current and line.startswith("   "):
            current.text = (current.text + " " + line.strip()).strip()
    return options, subcommands


def kvrail_commands(kvrail):
    """{command path tuple: options by name} for every command and subcommand of kvrail."""
    commands, queue = {}, [()]
    while queue:
        path = queue.pop()
        out = subprocess.run([kvrail, *path, "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, check=False).stdout.decode("utf-8")
        options, subcommands = parse_help(out)
        commands[path] = options
        queue.extend(path + (sub,) for sub in subcommands)
    return commands


def help_name(path):
    return "`kvrail %s --help`" % " ".join(path)


def paragraphs_of(path):
    return "docs" if path.startswith("docs/") else path


def check_path(root, files, dirs, token, target):
    """An error for a repository path (and an optional :target or :line), or None."""
    if target and target.isdigit():
        target = None  # file:line
    token = token.rstrip(".,")
    if "*" in token:
        return None if glob.glob(os.path.join(root, token)) else (
            "names %s, which matches no file" % token)
    stripped = token.rstrip("/")
    if stripped not in files and stripped not in dirs:
        return "names %s, which does not exist" % token
    if target and stripped in dirs:
        return check_target(root, stripped, target)
    return None


# Macros that define targets besides the one they are named for: a call `macro(name = "x")`
# also defines x + each suffix (tests/fuzz/fuzz.bzl).
MACRO_TARGET_SUFFIXES = {"kvrail_fuzz_test": ("_harness", "_libfuzzer")}


def defined_by_macro(text, target):
    for macro, suffixes in MACRO_TARGET_SUFFIXES.items():
        for suffix in suffixes:
            if target.endswith(suffix) and re.search(
                    r'%s\(\s*name = "%s"' % (macro, re.escape(target[:-len(suffix)])), text):
                return True
    return False


def check_target(root, package, target):
    if target in ("all", "*"):
        return None
    for build in ("BUILD.bazel", "BUILD"):
        text = "\n".join(read_lines(root, os.path.join(package, build)))
        if text:
            if ('"%s"' % target in text or os.path.exists(os.path.join(root, package, target))
                    or defined_by_macro(text, target)):
                return None
            return "names //%s:%s, which %s/%s does not define" % (package, target, package,
                                                                   build)
    return "names //%s:%s, but %s has no BUILD file" % (package, target, package)


def segments(line, fenced):
    """The code of a line: a fenced line whole, else each code span's content."""
    if fenced:
        return [line]
    return [m.group(0).strip("`") for m in CODE_SPAN.finditer(line)]


def starts_other_program(text):
    words = text.strip().lstrip("$ ").strip()
    for program in OTHER_PROGRAMS:
        if words == program or words.startswith(program + " ") or (
                program.endswith("/") and words.startswith(program)):
            return True
    return re.match(r"^[A-Z_]+=\S*\s+(bazel|python3|ucx_perftest)", words) is not None


def command_of(commands, words):
    """The longest command path that `words` (after "kvrail") begins with, or None."""
    path = ()
    for word in words:
        if path + (word,) in commands:
            path += (word,)
        else:
            break
    return path or None


def flags_in_segment(commands, segment):
    """(flag, command path or None, command error) for each flag of one segment of code."""
    out, errors = [], []
    if starts_other_program(segment) and "kvrail " not in segment:
        return out, errors
    pieces = SHELL_BREAK.split(segment)
    for piece in pieces:
        if starts_other_program(piece) and not re.search(r"kvrail\s", piece):
            continue
        position, command = 0, None
        mentions = list(KVRAIL_COMMAND.finditer(piece))
        if not mentions:
            for flag in FLAG.findall(piece):
                out.append((flag, None))
            continue
        for flag in FLAG.findall(piece[:mentions[0].start()]):
            out.append((flag, None))
        for i, mention in enumerate(mentions):
            words = mention.group(1).split()
            command = command_of(commands, words)
            if command is None:
                if COMMAND_LINE.match(piece):
                    errors.append("names `kvrail %s`, which `kvrail --help` does not list"
                                  % words[0])
                continue
            end = mentions[i + 1].start() if i + 1 < len(mentions) else len(piece)
            for flag in FLAG.findall(piece[mention.end():end]):
                out.append((flag, command))
            position = end
        del position
    return out, errors


def known_flag(flag, all_flags):
    """A flag of some kvrail command, of a program OTHER_FLAGS names, or Bazel's (a_b)."""
    return flag in all_flags or flag in OTHER_FLAGS or "_" in flag


def has_flag(commands, path, flag):
    """Whether `kvrail PATH` or, for a command with subcommands, one of them has `flag`."""
    return any(flag in options for p, options in commands.items() if p[:len(path)] == path)


def number(text):
    match = NUMBER_UNIT.match(text.replace(",", "").replace("\u202f", " ").strip())
    if not match:
        return None
    return float(match.group(1)) * UNITS[match.group(2)]


def normalised(text):
    return text.strip().strip("`'\"").strip().lower()


def help_default(option):
    """What the help states as the default: its `=VALUE`, else a "default: X" in its text."""
    if option.default is not None:
        return option.default
    match = re.search(r"\(default:? ([^)]*)\)|default:? ([^;,.)]+)", option.text)
    if match:
        return (match.group(1) or match.group(2)).strip()
    return None


def same_default(claim, option):
    stated = help_default(option)
    if stated is None:
        return option.boolean and normalised(claim) in ("off", "false", "unset")
    # A flag named for its unit (--max-room-gib) states its default in that unit.
    unit = re.search(r"-(kib|mib|gib)$", option.names[0] if option.names else "")
    scale = UNITS[{"kib": "KiB", "mib": "MiB", "gib": "GiB"}[unit.group(1)]] if unit else 1
    a, b = number(claim.strip().strip("`")), number(stated.strip().strip("`"))
    if b is not None:
        b *= scale
    if a is not None and b is not None:
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1)
    if normalised(claim) == normalised(stated):
        return True
    # "the interval, at most 1 s" against "the interval, at most 1": units are words here.
    words = lambda s: re.sub(r"\b(s|seconds?)\b", "", normalised(s)).replace(" ", "")
    return words(claim) == words(stated)


def default_claim(tail, value):
    """The default stated right after a flag's code span, or None."""
    match = re.match(r"^\s*\(([^)]*)\)?", tail)
    if match:
        clause = re.split(r"[;:]", match.group(1))[0].strip()
    else:
        match = re.match(r"^,\s*([^)]*?)\)", tail)
        if not match:
            return None
        clause = match.group(1).strip()
    clause = ROLES.sub("", clause).strip()
    forms = [r"^(?:the )?default:?\s+(`[^`]+`|[^,]+)", r"^(`[^`]+`|[^,(]+?) by default\b"]
    for form in forms:
        found = re.match(form, clause)
        if found:
            return found.group(1).strip()
    if re.match(r"^the default\b", clause) and value:
        return value.split()[0]
    if number(clause.split(",")[0]) is not None:
        return clause.split(",")[0]
    return None


def check_defaults(commands, line, following, line_commands):
    """Errors for the defaults stated after the flags of `line` (continued by `following`)."""
    errors = []
    for match in FLAG_SPAN.finditer(line):
        flag, value = match.group(1), match.group(2)
        claim = default_claim(line[match.end():] + " " + following, value)
        if claim is None:
            continue
        candidates = [(p, o[flag]) for p, o in commands.items() if flag in o]
        scoped = [(p, o) for p, o in candidates if p in line_commands]
        candidates = scoped or candidates
        if not candidates:
            continue  # reported as an unknown flag
        if any(same_default(claim, option) for _, option in candidates):
            continue
        said = []
        for path, option in candidates:
            if option.required:
                said.append("%s marks it REQUIRED" % help_name(path))
            else:
                said.append("%s says %s" % (help_name(path),
                                            help_default(option) or "no default"))
        errors.append("says %s defaults to %s, but %s" % (flag, claim, "; ".join(said)))
    return errors


def continuation(lines, number_):
    """The next two lines of the paragraph that line `number_` (1-based) is in, joined."""
    out = []
    for line in lines[number_:number_ + 2]:
        if not line.strip() or line.lstrip().startswith(("|", "```", "~~~", "#", "- ", "* ")):
            break
        out.append(line.strip())
    return " ".join(out)


def squeezed(text):
    """Text as a title citation is compared: no markup, one space, lower case."""
    return re.sub(r"\s+", " ", re.sub(r"[`*_]", "", text)).strip().lower()


def check_section_citations(root, files, docs_by_name):
    """Errors for `X.md, "Title"` citations whose doc does not contain Title, and a count."""
    errors, checked, texts = [], 0, {}
    for path in files:
        if not path.endswith(CITING_SUFFIXES) or path.startswith(SKIPPED_DIRS):
            continue
        for number_, line in enumerate(read_lines(root, path), 1):
            for match in SECTION_CITATION.finditer(line):
                name, title = match.group(1), match.group(2)
                doc = docs_by_name.get(name)
                if doc is None:
                    continue  # a document outside the tree, or a bare name checked elsewhere
                if doc not in texts:
                    texts[doc] = squeezed("\n".join(read_lines(root, doc)))
                checked += 1
                if squeezed(title) not in texts[doc]:
                    errors.append("%s:%d: cites %s, \"%s\", which %s does not contain"
                                  % (path, number_, name, title, doc))
    return errors, checked


def main():
    root = source_root()
    kvrail = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("KVRAIL_BIN")
    if not kvrail:
        kvrail = os.path.join(root, "bazel-bin", "tools", "kvrail")
    commands = kvrail_commands(os.path.abspath(kvrail))
    all_flags = set()
    for options in commands.values():
        all_flags.update(options)
    if len(commands) < 8 or "--role" not in commands.get(("sidecar",), {}):
        print("%s --help listed %d commands: not the kvrail binary" % (kvrail, len(commands)))
        return 1

    files = tracked_files(root)
    file_set = set(files)
    dirs = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    top = {f.split("/")[0] for f in files}
    basenames = {os.path.basename(f) for f in files}
    docs = [f for f in files if f.endswith(".md") and not f.startswith(SKIPPED_DIRS)]

    errors, counts = [], {"paths": 0, "flags": 0, "defaults": 0}
    for doc in docs:
        lines = read_lines(root, doc)
        renamed = {flag for flag in HISTORY_DOCS.get(doc, ())
                   if any("`%s` was renamed" % flag in line for line in lines)}
        for number_, line, fenced in all_lines(lines):
            where = "%s:%d: " % (doc, number_)
            text = LINK_TARGET.sub("]", line)
            for match in LABEL.finditer(text):
                package, target = match.group(1).rstrip("/"), match.group(2)
                if package.endswith("...") or not package:
                    continue
                counts["paths"] += 1
                if package not in dirs:
                    errors.append(where + "names //%s, which is no directory" % package)
                elif target:
                    error = check_target(root, package, target)
                    if error:
                        errors.append(where + error)
            for match in PATH.finditer(LABEL.sub(" ", text)):
                token, target = match.group(1), match.group(2)
                if token.split("/")[0] not in top or "..." in token or (
                        "tokenspeed" in token.split("/")):  # the reference's own tree
                    continue
                counts["paths"] += 1
                error = check_path(root, file_set, dirs, token, target)
                if error:
                    errors.append(where + error)
            for match in BARE_DOC.finditer(LABEL.sub(" ", PATH.sub(" ", text))):
                counts["paths"] += 1
                if match.group(1) not in basenames and match.group(1) not in EXTERNAL_DOCS:
                    errors.append(where + "names %s, which no file of the tree is called"
                                  % match.group(1))

            line_commands = set()
            for segment in segments(line, fenced) if doc not in FLAGS_NOT_KVRAIL else []:
                found, command_errors = flags_in_segment(commands, segment)
                errors.extend(where + e for e in command_errors)
                for flag, command in found:
                    counts["flags"] += 1
                    if flag in renamed:
                        continue
                    if command is not None:
                        line_commands.add(command)
                        if not has_flag(commands, command, flag):
                            errors.append(where + "names %s, which %s does not have"
                                          % (flag, help_name(command)))
                    elif not known_flag(flag, all_flags):
                        errors.append(where + "names %s, which no kvrail command's --help has"
                                      % flag)
            if not fenced and doc not in FLAGS_NOT_KVRAIL:
                prose = CODE_SPAN.sub(" ", line)
                if not starts_other_program(prose):
                    for flag in FLAG.findall(prose):
                        counts["flags"] += 1
                        if flag not in renamed and not known_flag(flag, all_flags):
                            errors.append(where + "names %s, which no kvrail command's --help "
                                          "has" % flag)
                following = continuation(lines, number_)
                errors.extend(where + e
                              for e in check_defaults(commands, line, following, line_commands))
                counts["defaults"] += sum(
                    1 for m in FLAG_SPAN.finditer(line)
                    if default_claim(line[m.end():] + " " + following, m.group(2)) is not None)

    docs_by_name = {}
    for doc in docs:
        docs_by_name.setdefault(os.path.basename(doc), doc)
    citation_errors, counts["sections"] = check_section_citations(root, files, docs_by_name)
    errors.extend(citation_errors)
    for error in errors:
        print(error)
    if counts["paths"] < 100 or counts["flags"] < 100 or counts["defaults"] < 10:
        print("found only %(paths)d paths, %(flags)d flags and %(defaults)d defaults: the docs "
              "were not found" % counts)
        return 1
    print("%d docs: %d paths, %d flags (%d kvrail commands' --help), %d defaults and %d section "
          "citations checked: %d wrong" % (len(docs), counts["paths"], counts["flags"],
                                           len(commands), counts["defaults"],
                                           counts["sections"], len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
