#include "plan_arena.h"

#include <stdio.h>

#include "cli.h"

void plan_arena_args_default(struct plan_arena_args *a)
{
    *a = (struct plan_arena_args){.explain = -1};
    arena_options_default(&a->o);
}

int plan_arena_option(int argc, char **argv, int *i, struct plan_arena_args *a, int *rc)
{
    static const char *const names[] = {"--arena", "--explain-arena", "--arena-cap",
                                        "--arena-seed", "--arena-generations", "--arena-stall",
                                        "--arena-time-limit"};
    const char *v;
    long n = 0;
    int k = 0, r = 0;
    for (; k < 7 && (r = cli_option(argc, argv, i, names[k], &v)) == 0; k++)
        ;
    *rc = r < 0 ? ERR_INPUT : ERR_OK;
    if (r <= 0)
        return r < 0;
    int bad = k == 0   ? arena_method_find(v) == NULL
              : k == 2 ? cli_parse_bytes(v, &a->o.cap_bytes)
              : k == 6 ? cli_parse_double(v, &a->o.time_limit_s) || !(a->o.time_limit_s > 0)
                       : cli_parse_int(v, k == 1 || k == 3 ? 0 : 1, 1L << 30, &n);
    if (bad)
        *rc = cli_usage_error("plan", "%s: \"%s\" is not %s", names[k], v,
                              k == 0 ? "slots, greedy, ga or exact" : "a valid value");
    else if (k == 0)
        snprintf(a->o.method, sizeof a->o.method, "%s", v);
    a->on |= k == 0;
    if (k == 1)
        a->explain = n;
    a->o.seed = k == 3 ? (uint64_t)n : a->o.seed;
    a->o.generations = k == 4 ? (int)n : a->o.generations;
    a->o.stall = k == 5 ? (int)n : a->o.stall;
    return 1;
}

int plan_arena_apply(const struct plan_arena_args *a, struct plan *p, struct err *e)
{
    if (a->explain >= p->n_stages) {
        plan_free(p);
        return err_set(e, ERR_INPUT, "--explain-arena: stage %ld, but the plan has %d stages",
                       a->explain, p->n_stages);
    }
    int rc = arena_plan(p, &a->o, e);
    for (int s = 0; rc == ERR_OK && s < p->n_stages; s++)
        if (p->stages[s].memory_bytes > p->stages[s].memory_limit_bytes)
            rc = err_set(e, ERR_NOFIT, "stage %d: the %s arena of %lld bytes makes the stage "
                         "%lld bytes, over its memory_limit_bytes %lld", s, a->o.method,
                         (long long)p->stages[s].arena->bytes,
                         (long long)p->stages[s].memory_bytes,
                         (long long)p->stages[s].memory_limit_bytes);
    if (rc)
        plan_free(p);
    return rc;
}
