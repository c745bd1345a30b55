#!/usr/bin/env python3
"""Every protocol citation resolves, and every relative link in the docs reaches a file.

docs/PROTOCOL.md keeps the section numbers of the CachePD specification the code was written
from, so "CACHEPD §N.M" anywhere in the tree means "docs/PROTOCOL.md §N.M". This check fails
when
  * a tracked source or doc file cites "CACHEPD §N(.M)*" (or a list after it: "CACHEPD §3.2,
    §3.3", "CACHEPD §12.3-§12.5"), or "PROTOCOL.md §N(.M)*", naming a section that
    docs/PROTOCOL.md has no heading for;
  * docs/PROTOCOL.md cites one of its own sections ("§N.M") that it has no heading for;
  * a relative markdown link in a tracked .md file points to a file that does not exist, or
    to an anchor of docs/PROTOCOL.md that none of its headings makes.

Usage: doc_links_test.py [ROOT]. Without ROOT (under Bazel) the root is the source tree that
the runfile README.md links to. Files are those `git ls-files` lists, or, outside a git
checkout, every file under ROOT but bazel-* and hidden directories.
"""

import os
import re
import sys

from doc_tree import CODE_SPAN, prose_lines, read_lines, source_root, tracked_files

PROTOCOL = "docs/PROTOCOL.md"
CITING_SUFFIXES = (".cc", ".h", ".py", ".proto", ".md", ".sh", ".bzl", ".bazel", ".service",
                   ".toml")

NUMBER = r"(\d+(?:\.\d+)*)"
# "§3.2, §3.3", "§12.3-§12.5", "§4.5 and §4.6": further sections of one citation.
CONTINUATION = re.compile(r"\s*(?:,|-|–|/|\band\b|\bor\b|\bto\b)\s*§" + NUMBER)
CITATION = re.compile(r"(?:CACHEPD|PROTOCOL\.md),?\s*§" + NUMBER)
OWN_REFERENCE = re.compile(r"§" + NUMBER)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HEADING_SECTION = re.compile(r"^§" + NUMBER + r"\b")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")


def github_slug(heading, seen):
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    slug = re.sub(r"[^\w\- ]", "", text.lower(), flags=re.UNICODE).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else "%s-%d" % (slug, count)


def protocol_headings(lines):
    sections, slugs, seen = set(), set(), {}
    for _, line in prose_lines(lines):
        match = HEADING.match(line)
        if not match:
            continue
        text = match.group(2)
        slugs.add(github_slug(text, seen))
        section = HEADING_SECTION.match(text)
        if section:
            sections.add(section.group(1))
    return sections, slugs


def citations(line):
    for match in CITATION.finditer(line):
        yield match.group(1)
        end = match.end()
        while True:
            more = CONTINUATION.match(line, end)
            if not more:
                break
            yield more.group(1)
            end = more.end()


def links(lines):
    for number, line in prose_lines(lines):
        text = CODE_SPAN.sub("", line)
        for match in INLINE_LINK.finditer(text):
            yield number, match.group(1)
        match = REFERENCE_LINK.match(text)
        if match:
            yield number, match.group(1)


def check_link(root, path, target, protocol_slugs):
    """An error message for a broken relative link, or None."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None
    file_part, _, anchor = target.partition("#")
    if not file_part:
        resolved = path  # an anchor of the same file
    elif file_part.startswith("/"):
        resolved = os.path.normpath(file_part.lstrip("/"))
    else:
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
    if resolved.startswith(".."):
        return "link %s leaves the repository" % target
    if not os.path.exists(os.path.join(root, resolved)):
        return "link %s: %s does not exist" % (target, resolved)
    if anchor and resolved == PROTOCOL and anchor not in protocol_slugs:
        return "link %s: %s has no heading whose anchor is #%s" % (target, PROTOCOL, anchor)
    return None


def main():
    root = source_root()
    files = sorted(set(tracked_files(root)) | {PROTOCOL})
    protocol_lines = read_lines(root, PROTOCOL)
    if not protocol_lines:
        print("%s: missing or empty under %s" % (PROTOCOL, root))
        return 1
    sections, slugs = protocol_headings(protocol_lines)
    errors, cited, linked = [], 0, 0

    for path in files:
        if not path.endswith(CITING_SUFFIXES) and os.path.basename(path) != "BUILD":
            continue
        for number, line in enumerate(read_lines(root, path), 1):
            for section in citations(line):
                cited += 1
                if section not in sections:
                    errors.append("%s:%d: §%s is cited but %s has no heading §%s"
                                  % (path, number, section, PROTOCOL, section))

    for number, line in prose_lines(protocol_lines):
        if HEADING.match(line):
            continue
        for match in OWN_REFERENCE.finditer(CODE_SPAN.sub("", line)):
            if match.group(1) not in sections:
                errors.append("%s:%d: cites its own §%s, which is not one of its headings"
                              % (PROTOCOL, number, match.group(1)))

    for path in files:
        if not path.endswith(".md"):
            continue
        for number, target in links(read_lines(root, path)):
            linked += 1
            error = check_link(root, path, target, slugs)
            if error:
                errors.append("%s:%d: %s" % (path, number, error))

    for error in errors:
        print(error)
    # A scan that found nothing checked nothing: say so rather than pass.
    if cited == 0 or linked == 0 or len(sections) < 12:
        print("scanned %d files under %s and found %d citations, %d links and %d numbered "
              "headings: the tree was not found" % (len(files), root, cited, linked,
                                                     len(sections)))
        return 1
    print("%d citations of %d numbered sections and %d relative links checked in %d files: "
          "%d broken" % (cited, len(sections), linked, len(files), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
