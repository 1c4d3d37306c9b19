/* plan_load: a plan file (ballast-plan/1), as simulate and train read it. */
#include "fuzz_file.h"
#include "plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    if (plan_load(fuzz_file(data, size, "plan.json"), &p, &e) == ERR_OK)
        plan_free(&p);
    return 0;
}
