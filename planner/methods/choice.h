/* Plans no more complex than they are worth (`--min-gain`, issue 24 item 7). An optional
 * action (offload, the host optimizer, a partial recompute, an uneven split) is taken only
 * where it shortens the step by at least min_gain of it: of the plans whose simulated step is
 * within that margin of the fastest found, the plan kept is the simplest by choice_key
 * (the device optimizer first, then fewer actions, fewer recomputed layers, a balanced
 * split; with --for F every plan weighed is one F runs). Steps closer than CHOICE_NOISE of each other
 * are equal, so floating-point noise never decides between two plans.
 *
 * The method searches (methods.c, offload.c, repartition.c) find the fastest; this file holds
 * the key, a plan's choices as a value (its snapshot), and the descent that trades the
 * fastest plan for a simpler one within the margin. */
#ifndef BALLAST_CHOICE_H
#define BALLAST_CHOICE_H

#include "planner.h"

/* Steps within this share of each other are the same step. */
#define CHOICE_NOISE 1e-12

/* What makes a plan harder to read, export and run, most important first; compared
 * lexicographically, less is simpler. */
struct choice_key {
    int host_optimizer; /* stages with their optimizer on the host */
    int split_optimizer; /* of which those hosting a fraction of it (its last layers') */
    int actions;        /* layers sending anything to the host or recomputing a partial option */
    int recomputed;     /* layers recomputed, whole or in part */
    int imbalance;      /* blocks away from cluster_default_split's, summed over stages */
};

void choice_key_of(const struct plan *p, const struct plan_options *o, struct choice_key *k);
/* < 0, 0, > 0 as a is simpler than, as simple as, or less simple than b. */
int choice_key_cmp(const struct choice_key *a, const struct choice_key *b);
/* Blocks of stages[s] (or layers, for a custom model) away from the default split's. */
int choice_imbalance(const struct model *m, int n_layers, int n_stages, const int *first);

/* The longest step a simpler plan may take: fastest_ms x (1 + min_gain), and the noise. */
double choice_cap(double fastest_ms, double min_gain);

/* Whether stage s with its current actions fits its device memory (its arena laid out by
 * o->arena when given) and its host memory. */
int choice_stage_fits(const struct plan *p, int s, const struct plan_options *o, int *fits,
                      struct err *e);

/* A plan's choices as a value: per layer its action, per stage its optimizer place and
 * whether it fits; `ms` its simulated step (INFINITY when a stage does not fit). */
struct choice_snapshot {
    int n_stages, n_layers;
    struct layer_action *actions;
    unsigned char *optimizer, *fits; /* per stage */
    int *optimizer_from;             /* per stage: its first layer hosting it (plan.h) */
    double ms;
};

/* Saves p's choices, each stage's fit (judged by o; NULL: known to fit, each stage's choice
 * taken from a snapshot where it fits) and the step. */
int choice_save(const struct plan *p, const struct plan_options *o, struct choice_snapshot *c,
                struct err *e);
void choice_restore(struct plan *p, const struct choice_snapshot *c);
void choice_restore_stage(struct plan *p, const struct choice_snapshot *c, int s);
void choice_free(struct choice_snapshot *c);

/* From p's current choices (which fit), the simplest plan within `cap` that takes, whole or
 * stage by stage, any of the alternatives' choices where they fit: the simplest alternative
 * within the cap where it is simpler than p (or p is not within it; ties: the shorter step),
 * then each stage's alternatives in turn while one makes the plan simpler and stays within
 * the cap (a GPU holding several chunks, schedule.h, takes an alternative's choices for all
 * of them at once: their memory is one). p ends within the cap where p or an alternative
 * was. */
int choice_simplify(struct plan *p, const struct plan_options *o,
                    const struct choice_snapshot *const *alts, int n_alts, double cap,
                    struct err *e);

#endif
