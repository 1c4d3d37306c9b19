"""The PyTorch tests need Debian's python3-torch, which the README's test command installs
(scripts/deps.sh). Missing where Debian offers it, that is a failure; where no package
source offers it, the test is skipped (exit 77, CTest's SKIP_RETURN_CODE) and says so."""
import subprocess
import sys


def _offered():
    """Whether apt has a candidate for python3-torch (unknown without apt: assume it is)."""
    try:
        out = subprocess.run(["apt-cache", "policy", "python3-torch"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return True
    return "Candidate:" in out and "Candidate: (none)" not in out


def require_torch(test):
    try:
        import torch  # noqa: F401
    except ImportError:
        if _offered():
            sys.exit("%s: PyTorch is missing for %s; install it with scripts/deps.sh (Debian "
                     "package python3-torch, for /usr/bin/python3)" % (test, sys.executable))
        print("%s: skipped: no package source here offers python3-torch" % test)
        sys.exit(77)


def require_transformers(test):
    """transformers comes from PyPI (profiler/torch/requirements.txt), which scripts/deps.sh
    installs and so scripts/test.sh and CI; without it (ctest run on its own, no PyPI) the
    test is skipped and says so."""
    require_torch(test)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("%s: skipped: transformers is not installed for %s (scripts/deps.sh installs "
              "profiler/torch/requirements.txt)" % (test, sys.executable))
        sys.exit(77)


def run_cli(argv):
    """python3 -m profiler.torch ARGV in this process (no interpreter start per case): its exit
    status and standard error. Run from the repository root."""
    import contextlib
    import io
    from profiler.torch.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return code, err.getvalue()


def finish(test, fails):
    """Prints each failure and the count; the exit status."""
    for f in fails:
        print("FAIL", f)
    print("%s: %d failure(s)" % (test, len(fails)))
    return 1 if fails else 0
