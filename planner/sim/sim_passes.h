/* The simulator's pass-by-pass walk (sim_passes.c): any schedule of schedule.h, for the
 * stages of sim.h (virtual stages in model order; no stage run layer by layer). */
#ifndef BALLAST_SIM_PASSES_H
#define BALLAST_SIM_PASSES_H

#include "sim.h"

/* out->iteration_ms, and the tasks, busy, update and tail times where out has arrays for
 * them. ERR_INPUT for a stage that offloads or hosts its optimizer. */
int sim_passes(const struct schedule_shape *sh, const struct sim_stage *stages,
               struct sim_result *out, struct err *e);

#endif
