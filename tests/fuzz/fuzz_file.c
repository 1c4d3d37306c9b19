#include "fuzz_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"

static char dir[FILEIO_PATH_MAX];
static char names[8][64];
static int n_names;

static void remove_dir(void)
{
    char path[FILEIO_PATH_MAX + 80];
    for (int i = 0; i < n_names; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static const char *path_of(const char *name)
{
    static char path[FILEIO_PATH_MAX + 80];
    if (dir[0] == '\0') {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ballast-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_dir);
    }
    int known = 0;
    for (int i = 0; i < n_names && !known; i++)
        known = strcmp(names[i], name) == 0;
    if (!known && n_names < 8)
        snprintf(names[n_names++], sizeof names[0], "%s", name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

const char *fuzz_file(const uint8_t *data, size_t size, const char *name)
{
    const char *path = path_of(name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || fileio_write_all(fd, data, (int64_t)size) != 0 || close(fd) != 0) {
        perror("fuzz: writing the input");
        abort();
    }
    return path;
}

void fuzz_file_copy(const char *source, const char *name)
{
    char from[FILEIO_PATH_MAX];
    snprintf(from, sizeof from, "%s/%s", BALLAST_SOURCE_DIR, source);
    FILE *f = fopen(from, "rb");
    if (f == NULL) {
        perror(from);
        abort();
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    fuzz_file(buf, n, name);
}
