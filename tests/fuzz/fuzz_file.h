/* libFuzzer targets for Ballast's loaders (tests/fuzz/README.md). The loaders read files, so
 * each input is written to one file in a directory of this process's own, made once and
 * removed at exit, and the loader is given its name. */
#ifndef BALLAST_FUZZ_FILE_H
#define BALLAST_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>

/* The input's bytes as the file `name` in the directory; its path. Aborts on a failure to
 * write (the machine's, not the loader's). */
const char *fuzz_file(const uint8_t *data, size_t size, const char *name);
/* Copies BALLAST_SOURCE_DIR/`source` into the directory as `name` (a profile the cluster
 * inputs name). */
void fuzz_file_copy(const char *source, const char *name);

#endif
