/* memfd_create */
#define _GNU_SOURCE
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int fileio_open_input(const char *file, int64_t max_bytes, int *fd, int64_t *size,
                      struct err *e)
{
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
    int f = open(file, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0)
        return err_set(e, ERR_INPUT, "%s: cannot open: %s", file, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(f);
        return err_set(e, ERR_INPUT, "%s: not a regular file", file);
    }
    if (max_bytes > 0 && (int64_t)st.st_size > max_bytes) {
        close(f);
        return err_set(e, ERR_INPUT,
                       "%s: %lld bytes, larger than the %lld bytes (%lld MiB) accepted for "
                       "this kind of file",
                       file, (long long)st.st_size, (long long)max_bytes,
                       (long long)(max_bytes >> 20));
    }
    int flags = fcntl(f, F_GETFL);
    if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        close(f);
        return err_set(e, ERR_FAIL, "%s: fcntl: %s", file, strerror(errno));
    }
    *fd = f;
    *size = (int64_t)st.st_size;
    return ERR_OK;
}

/* read or write until all n bytes are done, retrying interrupted and short calls */
static int transfer_all(int fd, char *p, int64_t n, int writing)
{
    while (n > 0) {
        ssize_t k = writing ? write(fd, p, (size_t)n) : read(fd, p, (size_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= k;
    }
    return 0;
}

int fileio_write_all(int fd, const void *p, int64_t n)
{
    return transfer_all(fd, (char *)p, n, 1);
}

int fileio_read_all(int fd, void *p, int64_t n)
{
    return transfer_all(fd, p, n, 0);
}

int fileio_memory_file(const char *name, const void *data, int64_t n, int *fd,
                       char path[FILEIO_PATH_MAX], struct err *e)
{
    int f = memfd_create(name, MFD_CLOEXEC);
    if (f < 0)
        return err_set(e, ERR_FAIL, "%s: cannot make a file in memory: %s", name,
                       strerror(errno));
    if (fileio_write_all(f, data, n) != 0) {
        int saved = errno;
        close(f);
        return err_set(e, ERR_FAIL, "%s: cannot write a file in memory: %s", name,
                       strerror(saved));
    }
    *fd = f;
    snprintf(path, FILEIO_PATH_MAX, "/proc/self/fd/%d", f);
    return ERR_OK;
}

/* dir: `file`'s directory ("." when it has none); base: its last component. */
static int split_path(const char *file, char *dir, char *base, struct err *e)
{
    size_t n = strlen(file);
    if (n == 0)
        return err_set(e, ERR_INPUT, "an output file name is empty");
    if (n >= FILEIO_PATH_MAX)
        return err_set(e, ERR_INPUT, "%s: path too long", file);
    const char *slash = strrchr(file, '/');
    if (slash == NULL) {
        strcpy(dir, ".");
        strcpy(base, file);
    } else {
        size_t d = slash == file ? 1 : (size_t)(slash - file);
        memcpy(dir, file, d);
        dir[d] = '\0';
        strcpy(base, slash + 1);
    }
    if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return err_set(e, ERR_INPUT, "%s: names a directory, not a file", file);
    return ERR_OK;
}

/* Creates `<file>.tmp.<pid>.XXXXXX` with mkstemp (O_EXCL); the pid tells a later run whether
 * the writer is gone. */
static int make_temp(const char *file, char *tmp, size_t cap, int *fd, int *saved_errno)
{
    snprintf(tmp, cap, "%s.tmp.%ld.XXXXXX", file, (long)getpid());
    *fd = mkstemp(tmp);
    *saved_errno = errno;
    if (*fd < 0)
        return -1;
    /* mkstemp makes 0600; an output gets the mode open(0644) would give it */
    mode_t mask = umask(0);
    umask(mask);
    fchmod(*fd, 0644 & ~mask);
    return 0;
}

static int check_target(const char *file, struct err *e)
{
    struct stat st;
    if (stat(file, &st) != 0)
        return errno == ENOENT ? ERR_OK
                               : err_set(e, ERR_INPUT, "%s: %s", file, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return err_set(e, ERR_INPUT, "%s: exists and is not a regular file; not replacing it",
                       file);
    /* root passes access(W_OK) on any file: the mode bits say what the owner meant */
    if ((st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || access(file, W_OK) != 0)
        return err_set(e, ERR_INPUT, "%s: exists and is read-only; not replacing it", file);
    return ERR_OK;
}

static int check_dir(const char *dir, const char *file, struct err *e)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return err_set(e, ERR_INPUT, "%s: directory %s: %s", file, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return err_set(e, ERR_INPUT, "%s: %s is not a directory", file, dir);
    return ERR_OK;
}

/* The file an output replaces: `file`, or the file its symbolic links lead to (the link is
 * written through, not replaced; fileio.h). */
static int resolve_target(const char *file, char target[FILEIO_PATH_MAX], struct err *e)
{
    struct stat st;
    if (strlen(file) >= FILEIO_PATH_MAX)
        return err_set(e, ERR_INPUT, "%s: path too long", file);
    if (lstat(file, &st) != 0 || !S_ISLNK(st.st_mode)) {
        strcpy(target, file);
        return ERR_OK;
    }
    char *real = realpath(file, NULL);
    if (real == NULL)
        return err_set(e, ERR_INPUT, "%s: a symbolic link that leads nowhere (%s); not "
                       "writing through it", file, strerror(errno));
    int fits = strlen(real) < FILEIO_PATH_MAX;
    if (fits)
        strcpy(target, real);
    free(real);
    return fits ? ERR_OK : err_set(e, ERR_INPUT, "%s: the file it links to has too long a path",
                                   file);
}

int fileio_out_open(struct fileio_out *o, const char *file, struct err *e)
{
    char dir[FILEIO_PATH_MAX], base[FILEIO_PATH_MAX];
    int saved;
    o->fd = -1;
    o->tmp[0] = '\0';
    ERR_TRY(split_path(file, dir, base, e));
    ERR_TRY(resolve_target(file, o->target, e));
    ERR_TRY(split_path(o->target, dir, base, e));
    ERR_TRY(check_dir(dir, file, e));
    ERR_TRY(check_target(file, e)); /* stat follows the links: their target's mode */
    if (make_temp(o->target, o->tmp, sizeof o->tmp, &o->fd, &saved) != 0)
        return err_set(e, ERR_INPUT, "%s: cannot create a file in %s: %s", file, dir,
                       strerror(saved));
    return ERR_OK;
}

int fileio_out_check(const char *file, struct err *e)
{
    struct fileio_out o;
    ERR_TRY(fileio_out_open(&o, file, e));
    fileio_out_discard(&o);
    return ERR_OK;
}

int fileio_dir_check(const char *dir, struct err *e)
{
    char probe[FILEIO_PATH_MAX + 16];
    if (snprintf(probe, sizeof probe, "%s/.probe", dir) >= (int)sizeof probe)
        return err_set(e, ERR_INPUT, "%s: path too long", dir);
    struct stat st;
    if (stat(dir, &st) != 0)
        return err_set(e, ERR_INPUT, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return err_set(e, ERR_INPUT, "%s: not a directory", dir);
    char tmp[sizeof probe + 64];
    int fd, saved;
    if (make_temp(probe, tmp, sizeof tmp, &fd, &saved) != 0)
        return err_set(e, ERR_INPUT, "%s: cannot create a file there: %s", dir,
                       strerror(saved));
    close(fd);
    unlink(tmp);
    return ERR_OK;
}

int fileio_make_dirs(const char *dir, struct err *e)
{
    char path[FILEIO_PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return err_set(e, ERR_INPUT, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return err_set(e, ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
        *p = saved;
        if (saved == '\0')
            return ERR_OK;
    }
}

void fileio_out_discard(struct fileio_out *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp[0] != '\0')
        unlink(o->tmp);
    o->fd = -1;
    o->tmp[0] = '\0';
}

/* `name` is `<base>.tmp.<pid>` or `<base>.tmp.<pid>.<suffix>` with a pid that no longer
 * exists here: a temporary a killed writer left. */
static int is_stale_temp(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0)
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(name + n + 5, &end, 10);
    if (end == name + n + 5 || errno != 0 || pid <= 0 || (*end != '\0' && *end != '.'))
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static void remove_stale_temps(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        char path[2 * FILEIO_PATH_MAX + 2];
        if (!is_stale_temp(ent->d_name, base))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        unlink(path);
    }
    closedir(d);
}

int fileio_out_commit(struct fileio_out *o, const char *file, int ok, struct err *e)
{
    int saved = errno;
    if (ok && fsync(o->fd) != 0) {
        ok = 0;
        saved = errno;
    }
    if (close(o->fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    o->fd = -1;
    if (ok && rename(o->tmp, o->target) != 0) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        fileio_out_discard(o);
        return err_set(e, ERR_FAIL, "%s: cannot write: %s", file, strerror(saved));
    }
    o->tmp[0] = '\0';
    char dir[FILEIO_PATH_MAX], base[FILEIO_PATH_MAX];
    struct err ignored;
    if (split_path(o->target, dir, base, &ignored) == ERR_OK) {
        /* the rename itself must reach the disk (a checkpoint's manifest names the file) */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        remove_stale_temps(dir, base);
    }
    return ERR_OK;
}
