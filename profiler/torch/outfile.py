"""The profile's output file, checked before anything is measured and replaced atomically.

As Ballast's own outputs (common/fileio.h): the target, if it exists, must be a regular file
with write permission; the profile is written to a temporary beside it (`<file>.tmp.<pid>.*`,
the same directory, so the rename is atomic), synced and renamed over it, so a failed or killed
run leaves the old file whole; a temporary left by a killed run (its pid no longer alive) is
removed by the next successful write. A symbolic link is written through: its target is
replaced and the link kept."""
import json
import os
import stat
import tempfile

from .errors import ProfileError


class Output:
    def __init__(self, path):
        self.path = path
        self.real = os.path.realpath(path)
        try:
            st = os.stat(self.real)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise ProfileError("-o %s: %s" % (path, exc.strerror)) from None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ProfileError("-o %s: exists and is not a regular file" % path)
        if st is not None and not os.access(self.real, os.W_OK):
            raise ProfileError("-o %s: exists without write permission" % path)
        directory = os.path.dirname(self.real)
        try:
            self.fd, self.tmp = tempfile.mkstemp(
                dir=directory, prefix=os.path.basename(self.real) + ".tmp.%d." % os.getpid())
        except OSError as exc:
            raise ProfileError("-o %s: cannot write in %s: %s"
                               % (path, directory, exc.strerror)) from None
        # mkstemp makes 0600; the profile gets the mode open() would give it
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(self.fd, 0o644 & ~mask)

    def commit(self, prof):
        """Writes prof as JSON to the temporary, then renames it over the target."""
        try:
            with os.fdopen(self.fd, "w") as f:
                self.fd = None
                json.dump(prof, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.tmp, self.real)
            self.tmp = None
            dfd = os.open(os.path.dirname(self.real), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            self.discard()
            raise ProfileError("-o %s: %s" % (self.path, exc.strerror), 1) from None
        self._remove_stale()

    def _remove_stale(self):
        directory, prefix = os.path.dirname(self.real), os.path.basename(self.real) + ".tmp."
        for name in os.listdir(directory):
            pid = name[len(prefix):].split(".")[0] if name.startswith(prefix) else ""
            if pid.isdigit() and not _alive(int(pid)):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass

    def discard(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True
