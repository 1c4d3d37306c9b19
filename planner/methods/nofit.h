/* Why no plan fits: the message of ERR_NOFIT, with the numbers of every stage at fault. */
#ifndef BALLAST_NOFIT_H
#define BALLAST_NOFIT_H

#include "planner.h"

/* Sets ERR_NOFIT naming every stage of `p` that cannot fit even recomputing every layer, or,
 * if all could, why the method's choice does not fit; returns e->code. */
int nofit_report(const struct plan *p, const struct plan_options *o, struct err *e);

#endif
