/* The process's progress (progress.h): two atomics. */
#include "progress.h"

#include <stdatomic.h>

static atomic_ullong count;
static atomic_int waiting;

void progress_tick(void)
{
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
}

unsigned long long progress_count(void)
{
    return atomic_load_explicit(&count, memory_order_relaxed);
}

void progress_waiting(int on)
{
    atomic_store_explicit(&waiting, on, memory_order_relaxed);
    if (!on)
        progress_tick();
}

int progress_is_waiting(void)
{
    return atomic_load_explicit(&waiting, memory_order_relaxed);
}
