#include "lossscale.h"

#include <float.h>
#include <math.h>

int lossscale_check(const struct lossscale_config *c, struct err *e)
{
    if (!(c->initial > 0 && c->initial <= FLT_MAX))
        return err_set(e, ERR_INPUT, "--initial-loss-scale: %g, expected a number in (0, %g]",
                       c->initial, (double)FLT_MAX);
    if (!(c->min > 0 && c->min <= c->initial))
        return err_set(e, ERR_INPUT, "--min-loss-scale: %g, expected a number in (0, %g] (at "
                       "most --initial-loss-scale)", c->min, c->initial);
    if (!(c->growth > 1 && c->growth <= FLT_MAX))
        return err_set(e, ERR_INPUT, "--loss-scale-growth: %g, expected a factor above 1",
                       c->growth);
    if (!(c->backoff > 0 && c->backoff < 1))
        return err_set(e, ERR_INPUT, "--loss-scale-backoff: %g, expected a factor in (0, 1)",
                       c->backoff);
    if (c->window < 1)
        return err_set(e, ERR_INPUT, "--loss-scale-window: %lld, expected at least 1 step",
                       (long long)c->window);
    if (c->hysteresis < 1)
        return err_set(e, ERR_INPUT, "--hysteresis: %lld, expected at least 1 overflow",
                       (long long)c->hysteresis);
    return ERR_OK;
}

void lossscale_init(struct lossscale *s, const struct lossscale_config *c)
{
    s->scale = (float)c->initial;
    s->growth_tracker = 0;
    s->hysteresis_tracker = c->hysteresis;
    s->skipped = 0;
}

enum lossscale_verdict lossscale_update(struct lossscale *s, const struct lossscale_config *c,
                                        int overflow)
{
    float min = (float)c->min;
    if (!overflow) {
        if (++s->growth_tracker == c->window) {
            float grown = s->scale * (float)c->growth;
            s->growth_tracker = 0;
            s->hysteresis_tracker = c->hysteresis;
            if (isfinite(grown))
                s->scale = grown;
        }
        return LOSSSCALE_STEP;
    }
    s->growth_tracker = 0;
    s->hysteresis_tracker--;
    s->skipped++;
    if (s->hysteresis_tracker > 0)
        return LOSSSCALE_SKIP;
    if (s->scale <= min)
        return LOSSSCALE_AT_MIN;
    float lower = s->scale * (float)c->backoff;
    s->scale = lower > min ? lower : min;
    return LOSSSCALE_SKIP;
}

float lossscale_inverse(const struct lossscale *s)
{
    return (float)(1.0 / (double)s->scale);
}
