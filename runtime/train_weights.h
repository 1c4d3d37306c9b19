/* The weights of `ballast train` in and out as safetensors (safetensors.h), for one plan and
 * for time-shared jobs alike: --init before the first step, --save-weights after the last. */
#ifndef BALLAST_TRAIN_WEIGHTS_H
#define BALLAST_TRAIN_WEIGHTS_H

#include <mpi.h>

#include "err.h"
#include "stage.h"

/* Stage `stage`'s weights from `pattern` (with ST_STAGE_MARK: the stage's own file). */
int train_weights_load(struct stage_runner *st, const char *pattern, int stage, struct err *e);

/* Every stage's weights into `pattern`, each rank of `comm` (its stages, ranks in stage order)
 * passing its own: with ST_STAGE_MARK each writes its own file; without, rank 0 gathers them
 * (their sizes first, its memory for all of them agreed before any byte moves) and writes one
 * file. Every rank of `comm` calls it; none waits for one that failed. Returns this rank's own
 * status (ERR_OK when only another rank failed): the caller agrees on the outcome, and the
 * first rank that failed has the message. A file is written whole or not at all (its
 * temporary removed). */
int train_weights_save(struct stage_runner *st, MPI_Comm comm, const char *pattern,
                       struct err *e);

#endif
