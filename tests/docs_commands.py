"""The documentation's commands work as written, and its links lead somewhere.

Every fenced block of README.md and docs/*.md opened with "```sh runnable" is run with bash
(-e: every command must exit 0), the blocks of one document in order in one scratch folder
that sees the source tree's files and folders and `build` (the build folder), so that
`build/ballast` and `configs/...` resolve as from the repository root and whatever a command
writes stays in the scratch folder. Every relative link must name an existing file and, after
a #, a heading of it; nothing may point outside the repository.

usage: python3 tests/docs_commands.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

source, build = (os.path.abspath(p) for p in sys.argv[1:3])

# Written on other branches of this wave and linked from docs/README.md before they arrive:
# remove a name once its file is in the tree.
ARRIVING = set()
BLOCK_TIMEOUT_S = 300


def documents():
    docs = os.path.join(source, "docs")
    return [os.path.join(source, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))


def blocks(text):
    """(line number, code) of each runnable block"""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*(.*)$", lines[i])
        if m and m.group(1):
            start, i = i, i + 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if "runnable" in m.group(2).split():
                out.append((start + 1, "\n".join(body)))
        i += 1
    return out


def scratch():
    d = tempfile.mkdtemp(prefix="ballast-docs-")
    for name in os.listdir(source):
        if name not in ("build", "out", ".git") and not name.startswith("build-"):
            os.symlink(os.path.join(source, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def run_blocks(doc, failures):
    found = blocks(open(doc).read())
    if not found:
        return 0
    d = scratch()
    try:
        for line, code in found:
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=d,
                               capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
            if r.returncode != 0:
                failures.append(f"{os.path.relpath(doc, source)}:{line}: exit {r.returncode}\n"
                                f"{code}\n--- stderr (end):\n{r.stderr[-2000:]}")
    finally:
        shutil.rmtree(d)
    return len(found)


def slug(heading):
    """GitHub's anchor of a heading"""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    text = open(path).read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def check_links(doc, failures):
    text = open(doc).read()
    where = os.path.relpath(doc, source)
    for bad in ("../shared", "/work/"):
        if bad in text:
            failures.append(f"{where}: names {bad}, outside the repository")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not full.startswith(source + os.sep):
            failures.append(f"{where}: link {target} leaves the repository")
        elif not os.path.exists(full):
            if os.path.basename(full) not in ARRIVING:
                failures.append(f"{where}: link {target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            failures.append(f"{where}: link {target}: no heading #{anchor} in {path or where}")


def main():
    failures, ran = [], 0
    for doc in documents():
        check_links(doc, failures)
        ran += run_blocks(doc, failures)
    print(f"{ran} runnable blocks in {len(documents())} documents")
    for f in failures:
        print(f"FAIL {f}\n")
    sys.exit(1 if failures or ran == 0 else 0)


main()
