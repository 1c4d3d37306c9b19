/* share_load: a share file (ballast-share/1), as train --share reads it. */
#include "fuzz_file.h"
#include "share.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct share s;
    struct err e;
    err_clear(&e);
    if (share_load(fuzz_file(data, size, "share.json"), &s, &e) == ERR_OK)
        share_free(&s);
    return 0;
}
