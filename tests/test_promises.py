"""Promises the code makes about itself, checked:
- every MPI call in runtime/ goes through one of mpicheck.h's wrappers (MPI_CHECK,
  mpicheck_collective, MPI_OK, MPI_RELEASE), mpicheck.c itself, which implements them, aside;
- the planner's libraries (the planner, the models and common below it) call no BLAS, CUDA,
  NCCL, MPI or OpenMP: no such symbol is undefined in their archives (nm -u);
- no C source outside models/ tests a model's kind (a MODEL_KIND_ constant, or a kind's name
  compared as a string): what a kind is made of is its descriptor's (common/model_kind.h's
  traits and fields, models/model_ops.h's operations), so that a new kind is its files in
  models/ and its registration; excepted: models/ (the kinds themselves), tests/ (which build
  models of each kind), runtime/*_layers.c and the CUDA kernels (a kind's runtime layers are
  its implementation, reached through runtime/model_layers.c's table), common/model.h (which
  declares the kinds) and common/model_kind.c (their table, indexed by them);
- every document a source file or a document names (NAME.md, docs/NAME.md) is in the
  repository;
- a function's name is defined in one file only (each program's main, each command's help and
  a kernel's host and device versions aside), so that a name says one thing across the tree;
- the project's own headers include one another without a circle (a header that needs a
  declaration from one that needs it back: the declaration belongs in the lower of the two);
- no C file calls, through others or directly, back into a file that calls it: the files of
  common/, models/, planner/, runtime/, profiler/ and cli/ are layers (a part that calls up into
  its caller belongs below it, or its shared piece does).
Each check is made to fail on a planted example of what it forbids, so that it cannot pass
vacuously.
usage: python3 tests/test_promises.py REPO LIB.a [LIB.a ...]"""
import os
import re
import subprocess
import sys

FAILS = []

# an MPI function call: MPI_ then a capitalised word, then "("
MPI_CALL = re.compile(r"\bMPI_[A-Z][a-z0-9_]*\s*\(")
WRAPPERS = ("MPI_CHECK(", "MPI_OK(", "MPI_RELEASE(", "mpicheck_collective(")


def unwrapped_mpi(text):
    """The line numbers of MPI calls not immediately inside a wrapper."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.S)
    bad = []
    for m in MPI_CALL.finditer(code):
        before = code[:m.start()].rstrip()
        if not before.endswith(WRAPPERS):
            bad.append(code.count("\n", 0, m.start()) + 1)
    return bad


def check_mpi(texts):
    for f, text in texts.items():
        if f.startswith("runtime/") and f.endswith((".c", ".h", ".cu", ".cuh")) and \
                f != "runtime/mpicheck.c":
            for line in unwrapped_mpi(text):
                FAILS.append("%s:%d: an MPI call outside mpicheck.h's wrappers" % (f, line))


FORBIDDEN = re.compile(r"^(P?MPI_|ompi_|cblas_|[sdcz]gemm_?$|openblas_|cuda|cu[A-Z]|cublas|"
                       r"nccl|__cuda|GOMP_|omp_)")


def forbidden_symbols(nm_output):
    return sorted({line.split()[-1] for line in nm_output.splitlines()
                   if line.strip() and FORBIDDEN.match(line.split()[-1])})


def check_libraries(libs):
    for lib in libs:
        out = subprocess.run(["nm", "-u", lib], capture_output=True, text=True, check=True).stdout
        for sym in forbidden_symbols(out):
            FAILS.append("%s: calls %s (BLAS, CUDA, NCCL, MPI or OpenMP in the planner's "
                         "libraries)" % (os.path.basename(lib), sym))


# a document's name: a path of word characters ending in .md; names built from shell or
# printf variables ($tag, %s, OUT, DEVICE placeholders), and paths in folders the repository
# does not have (out/, tour/: where commands write), are outputs, not documents
DOC = re.compile(r"(?<![\w$%/{.-])(\w[\w./-]*\.md)\b")
PLACEHOLDER = re.compile(r"OUT|DEVICE|NAME|tmp/")
SOURCES = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".md", ".txt", ".json", ".cmake")


# a kind constant, or a kind's name in a string comparison (strcmp and its kin, == or !=)
KIND_CONSTANT = re.compile(r"\bMODEL_KIND_[A-Z]+\b")
KIND_NAME = r'"(?:gpt|llama|custom)"'
KIND_COMPARE = re.compile(r"\bstr(?:n?case)?n?cmp\s*\([^;{}]*?" + KIND_NAME +
                          r"|[!=]=\s*" + KIND_NAME + r"|" + KIND_NAME + r"\s*[!=]=")
KIND_EXCEPT = ("models/", "tests/", "common/model.h", "common/model_kind.c")


def kind_tests(text):
    """The line numbers of tests of the model kind in a C source."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.S)
    found = [m.start() for m in KIND_CONSTANT.finditer(code)]
    found += [m.start() for m in KIND_COMPARE.finditer(code)]
    return sorted({code.count("\n", 0, at) + 1 for at in found})


def kind_excepted(f):
    return (f.startswith(KIND_EXCEPT) or f.endswith((".cu", ".cuh")) or
            (f.startswith("runtime/") and f.endswith("_layers.c")))


def check_kinds(texts):
    for f, text in texts.items():
        if not f.endswith((".c", ".h")) or kind_excepted(f):
            continue
        for line in kind_tests(text):
            FAILS.append("%s:%d: tests the model's kind (read a trait or an operation of its "
                         "descriptor instead: common/model_kind.h, models/model_ops.h)"
                         % (f, line))


def tracked(repo):
    out = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:  # not a checkout (a source tarball): every file under repo
        return [os.path.relpath(os.path.join(d, n), repo)
                for d, _, ns in os.walk(repo) if "/." not in d for n in ns]
    return out.stdout.split()


def read_tree(repo):
    """{path: text} of the repository's files (sorted), each read once: regular files that are
    UTF-8 text."""
    texts = {}
    for f in sorted(tracked(repo)):
        path = os.path.join(repo, f)
        if not os.path.isfile(path):
            continue
        try:
            texts[f] = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            pass
    return texts


def missing_docs(text, where, files, names):
    """The document names in `text` (a file at `where`) that are not in the repository."""
    folders = {os.path.dirname(f) for f in files}
    bad = []
    for m in DOC.finditer(text):
        doc = m.group(1)
        if PLACEHOLDER.search(doc) or (
                "/" in doc and os.path.dirname(doc) not in folders and
                os.path.normpath(os.path.join(os.path.dirname(where), os.path.dirname(doc)))
                not in folders):
            continue
        here = os.path.normpath(os.path.join(os.path.dirname(where), doc))
        if doc in files or here in files or (("/" not in doc) and doc in names):
            continue
        bad.append(doc)
    return bad


def check_docs(files, texts):
    names = {os.path.basename(f) for f in files}
    for f, text in texts.items():
        if not f.endswith(SOURCES) or f.startswith(("tests/data/", "bench/results/")) or \
                f == "tests/test_promises.py":
            continue
        for doc in missing_docs(text, f, files, names):
            FAILS.append("%s: names %s, which is not in the repository" % (f, doc))


INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
HEADERS = (".h", ".cuh")


def include_graph(texts):
    """Edges between headers from {path: text}: a quoted include names the header in the
    includer's folder, else the one header of that name elsewhere (the build's include
    folders); names not among `texts` (system, generated) are left out."""
    by_name = {}
    for f in texts:
        by_name.setdefault(os.path.basename(f), []).append(f)
    graph = {}
    for f, text in texts.items():
        for inc in INCLUDE.findall(text):
            here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            elsewhere = by_name.get(os.path.basename(inc), [])
            to = here if here in texts else elsewhere[0] if len(elsewhere) == 1 else None
            if to is not None and to != f:
                graph.setdefault(f, set()).add(to)
    return graph


def include_cycles(graph):
    """One circle (a list of files, the first repeated at the end) through each strongly
    connected group of more than one file, found by depth-first search."""
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path, stack = [start], {start: 0}, [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                node = path.pop()
                del on_path[node]
                done.add(node)
                stack.pop()
            elif nxt in on_path:
                cycles.append(path[on_path[nxt]:] + [nxt])
            elif nxt not in done:
                on_path[nxt] = len(path)
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return cycles


def check_includes(texts):
    headers = {f: t for f, t in texts.items()
               if f.endswith(HEADERS) and not f.startswith("tests/")}
    for cycle in include_cycles(include_graph(headers)):
        FAILS.append("include circle: %s" % " -> ".join(cycle))


# Names defined more than once on purpose: each program's main, each command's help, and a
# kernel's host (.c) and device (.cu) implementations of one name.
NAMES_SHARED = ("main", "help")


def definitions(text, exported_only=False):
    """The names of the functions `text` defines (the project's style: the signature from the
    first column, then a line holding "{"); with exported_only, those other files can call
    (not static)."""
    lines = text.split("\n")
    names = []
    for i, line in enumerate(lines):
        if line != "{" or i == 0:
            continue
        j = i - 1
        while j > 0 and not re.match(r"[A-Za-z_]", lines[j]):
            j -= 1
        m = re.match(r"(?:[A-Za-z_][\w\s*]*?[\s*])?(\w+)\s*\(", lines[j])
        start = lines[j - 1] if re.match(r"\w+\s*\(", lines[j]) and j > 0 else lines[j]
        if not m or lines[j].startswith(("struct ", "enum ", "typedef ", "union ")):
            continue
        if not (exported_only and start.startswith(("static", "struct ", "enum "))):
            names.append(m.group(1))
    return names


def name_collisions(defs):
    """{name: files} of names defined in more than one file, beyond NAMES_SHARED and one .cu
    file mirroring .c files."""
    bad = {}
    for name, where in defs.items():
        cu = [f for f in where if f.endswith(".cu")]
        if len(where) < 2 or name in NAMES_SHARED or (len(cu) == 1 and len(where) > 1):
            continue
        bad[name] = sorted(where)
    return bad


def check_names(texts):
    defs = {}
    for f, text in texts.items():
        if f.endswith((".c", ".cu")) and not f.startswith("tests/"):
            for name in set(definitions(text)):
                defs.setdefault(name, set()).add(f)
    for name, where in sorted(name_collisions(defs).items()):
        FAILS.append("%s is defined in %s: a name says one thing across the tree"
                     % (name, ", ".join(where)))


CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
LAYERED = ("common/", "models/", "planner/", "runtime/", "profiler/", "cli/")


def call_graph(texts):
    """{file: files whose functions it calls}, over the C files of the layered folders."""
    sources = {f: t for f, t in texts.items() if f.endswith(".c") and f.startswith(LAYERED)}
    home = {}
    for f, text in sources.items():
        for name in definitions(text, exported_only=True):
            home.setdefault(name, f)
    graph = {}
    for f, text in sources.items():
        code = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
        called = set(CALL.findall(code))
        graph[f] = {home[n] for n in called if n in home and home[n] != f}
    return graph


def check_calls(texts):
    for cycle in include_cycles(call_graph(texts)):
        FAILS.append("call circle: %s (the part that calls back up belongs below)"
                     % " -> ".join(cycle))


def self_test():
    """Each check catches what it forbids."""
    planted = "static int\nbetter(int a,\n       int b)\n{\n    return a < b;\n}\n"
    if definitions(planted) != ["better"]:
        FAILS.append("self-test: the definitions found: %r" % definitions(planted))
    got = name_collisions({"better": {"a.c", "b.c"}, "help": {"cmd_a.c", "cmd_b.c"},
                           "gemm": {"k.cu", "k_cpu.c"}, "attn": {"a.cu", "b.cu", "c.c"}})
    if got != {"better": ["a.c", "b.c"], "attn": ["a.cu", "b.cu", "c.c"]}:
        FAILS.append("self-test: the name check: %r" % got)
    planted = "int f(void)\n{\n    MPI_CHECK(MPI_Barrier(c), e);\n    MPI_Comm_free(&c);\n}\n"
    if unwrapped_mpi(planted) != [4]:
        FAILS.append("self-test: the MPI check missed an unwrapped call: %r"
                     % unwrapped_mpi(planted))
    if unwrapped_mpi("/* MPI_Send( in a comment */ x = MPI_OK(MPI_Send(b));") != []:
        FAILS.append("self-test: the MPI check flagged a comment or a wrapped call")
    nm = "                 U MPI_Send\n                 U glp_simplex\n         U cudaMalloc\n"
    if forbidden_symbols(nm) != ["MPI_Send", "cudaMalloc"]:
        FAILS.append("self-test: the symbol check: %r" % forbidden_symbols(nm))
    planted = ('/* "llama" in a comment, MODEL_KIND_GPT too */\n'
               'if (m->kind == MODEL_KIND_LLAMA)\n'
               '    x = strcmp(kind, "gpt") == 0;\n'
               'static const char *names[] = {"llama"};\n'
               'y = "custom" != k;\n')
    if kind_tests(planted) != [2, 3, 5]:
        FAILS.append("self-test: the model-kind check: %r" % kind_tests(planted))
    if not kind_excepted("runtime/llama_layers.c") or kind_excepted("runtime/layout.c") or \
            not kind_excepted("models/gpt.c") or kind_excepted("common/cost.c"):
        FAILS.append("self-test: the model-kind check's exceptions")
    files = {"docs/formats.md", "README.md"}
    got = missing_docs("see DESIGN.md and docs/formats.md, docs/nothing.md; writes "
                       "$out/x.md, tour/results.md and OUT/gpu-DEVICE.md", "common/x.h", files,
                       {"formats.md", "README.md"})
    if got != ["DESIGN.md", "docs/nothing.md"]:
        FAILS.append("self-test: the document check: %r" % got)
    planted = {"planner/a.h": '#include "b.h"\n#include <stdio.h>\n',
               "planner/b.h": '#include "cost.h"\n', "common/cost.h": '  # include "a.h"\n',
               "common/err.h": "", "planner/c.h": '#include "err.h"\n#include "c.h"\n'}
    got = include_cycles(include_graph(planted))
    if got != [["common/cost.h", "planner/a.h", "planner/b.h", "common/cost.h"]]:
        FAILS.append("self-test: the include check: %r" % got)
    planted["common/cost.h"] = '#include "err.h"\n'
    if include_cycles(include_graph(planted)) != []:
        FAILS.append("self-test: the include check saw a circle in %r" % planted)
    planted = {"planner/a.c": "int f(void)\n{\n    return g(); /* h() */\n}\n",
               "planner/b.c": "int\ng(void)\n{\n    return h(1);\n}\n",
               "common/c.c": "static int k(void)\n{\n    return 0;\n}\n"
                             "int h(int x)\n{\n    return f() + k();\n}\n",
               "planner/d.c": "static int f(void)\n{\n    return h(0);\n}\n",
               "tests/t.c": "int main(void)\n{\n    return f();\n}\n"}
    got = include_cycles(call_graph(planted))
    if got != [["common/c.c", "planner/a.c", "planner/b.c", "common/c.c"]]:
        FAILS.append("self-test: the call check: %r" % got)
    planted["common/c.c"] = "int h(int x)\n{\n    return x;\n}\n"
    if include_cycles(call_graph(planted)) != []:
        FAILS.append("self-test: the call check saw a circle in %r" % planted)


def main():
    repo, libs = sys.argv[1], sys.argv[2:]
    self_test()
    files = set(tracked(repo))
    texts = read_tree(repo)
    check_mpi(texts)
    check_libraries(libs)
    check_docs(files, texts)
    check_includes(texts)
    check_kinds(texts)
    check_names(texts)
    check_calls(texts)
    for f in FAILS:
        print("FAIL", f)
    print("test_promises: %d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
