/* Opening input files and replacing output files safely.
 *
 * Inputs: a FIFO or a device named as an input must not block the run forever, so a file is
 * opened without blocking and refused unless it is a regular file; its size is checked against
 * a cap before anything is read.
 *
 * Outputs are written to a unique temporary file beside the target (mkstemp: O_EXCL, an
 * unpredictable name, the same directory so that rename is atomic), synced and renamed over the
 * target. A temporary left by a killed run (named `<file>.tmp.<pid>...` with a pid no longer
 * alive on this host) is removed by the next successful write of the same file. An existing
 * target without write permission is refused rather than silently replaced.
 *
 * An output named by a symbolic link is written through it: the file the link points to is
 * replaced (its temporary beside it) and the link stays, as the shell's `>` would do; renaming
 * over the link would replace the link itself and leave the file it names as it was. A link
 * to nothing (dangling) is refused: where it points may be a typo. */
#ifndef BALLAST_FILEIO_H
#define BALLAST_FILEIO_H

#include <stdint.h>

#include "err.h"

#define FILEIO_PATH_MAX 4096

/* Opens `file` for reading: fails (ERR_INPUT, naming the file) when it cannot be opened, is not
 * a regular file, or is larger than max_bytes (max_bytes <= 0: no cap). On success *fd is a
 * blocking descriptor the caller closes and *size the file's size. */
int fileio_open_input(const char *file, int64_t max_bytes, int *fd, int64_t *size,
                      struct err *e);

/* Whether `file` can be written by fileio_out_open: its directory exists and accepts a new
 * file (probed by creating and removing one), and `file`, if it exists, is a regular file
 * with write permission. ERR_INPUT naming the file otherwise. Nothing is left behind. */
int fileio_out_check(const char *file, struct err *e);
/* The same for a directory that files will be written into (created if missing). */
int fileio_dir_check(const char *dir, struct err *e);
/* `mkdir -p dir`: dir and its missing parents (mode 0755); ERR_INPUT naming the first that
 * could not be made. */
int fileio_make_dirs(const char *dir, struct err *e);

/* An output being written: the temporary's descriptor and name, and the file it replaces
 * (the output's name, or the file its symbolic links lead to). */
struct fileio_out {
    int fd;
    char tmp[FILEIO_PATH_MAX + 64];
    char target[FILEIO_PATH_MAX];
};

/* Checks `file` as fileio_out_check does and creates its temporary. */
int fileio_out_open(struct fileio_out *o, const char *file, struct err *e);
/* Syncs the temporary, renames it over the target (`file`, or where its links lead), syncs the
 * directory and removes stale temporaries of the target. `ok` false (a write failed): discards the temporary and fails with
 * errno's reason. Either way the descriptor is closed. */
int fileio_out_commit(struct fileio_out *o, const char *file, int ok, struct err *e);
/* Discards the temporary (an error elsewhere). */
void fileio_out_discard(struct fileio_out *o);

/* An unnamed file in memory holding n bytes of `data` (Linux's memfd), named for messages by
 * `name`: *fd its descriptor, which the caller closes, and `path` (/proc/self/fd/N) a name
 * that opens it within this process. Nothing is left on disk however the process ends. */
int fileio_memory_file(const char *name, const void *data, int64_t n, int *fd,
                       char path[FILEIO_PATH_MAX], struct err *e);

/* Writes (reads) all n bytes, retrying short transfers; 0, or -1 with errno set (0 when a
 * read met the end of the file first). */
int fileio_write_all(int fd, const void *p, int64_t n);
int fileio_read_all(int fd, void *p, int64_t n);

#endif
