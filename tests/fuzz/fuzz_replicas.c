/* replicas_parse: a replicas file (ballast-replicas/1), as simulate reads it. */
#include <stdlib.h>

#include "fuzz_file.h"
#include "jsonio.h"
#include "replicas.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct plan *plans;
    int n;
    struct err e;
    err_clear(&e);
    const char *file = fuzz_file(data, size, "replicas.json");
    cJSON *root = jsonio_read_kind(file, JSONIO_PLAN, &e);
    if (root != NULL && replicas_parse(root, file, &plans, &n, &e) == ERR_OK) {
        for (int k = 0; k < n; k++)
            plan_free(&plans[k]);
        free(plans);
    }
    cJSON_Delete(root);
    return 0;
}
