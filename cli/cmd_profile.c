#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "devices.h"
#include "estimate.h"
#include "jsonio.h"
#include "model.h"
#include "profile.h"

static void help(void)
{
    printf("usage: ballast profile --model MODEL.json --estimate --device NAME [-o PROFILE.json]\n"
           "                       [--devices DEVICES.json]\n\n"
           "Writes a profile (ballast-profile/1): every planning layer's forward and backward time\n"
           "and its memory, for one micro-batch.\n\n"
           "  --model FILE     the model (ballast-model/1)\n"
           "  --estimate       derive the profile from datasheet figures (a roofline per\n"
           "                   operation) instead of measuring; marked \"estimated\": true\n"
           "  --device NAME    a device of the device table (with --estimate)\n"
           "  --devices FILE   the device table (default: %s)\n"
           "  -o FILE          where to write the profile (default: standard output)\n",
           devices_default_file());
}

int cmd_profile(int argc, char **argv)
{
    const char *model_file = NULL, *device = NULL, *out_file = NULL, *v;
    const char *devices_file = devices_default_file();
    int estimate = 0;
    struct err e;
    err_clear(&e);
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        } else if ((r = cli_option(argc, argv, &i, "--model", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            model_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--device", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            device = v;
        } else if ((r = cli_option(argc, argv, &i, "--devices", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            devices_file = v;
        } else if ((r = cli_option(argc, argv, &i, "-o", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            out_file = v;
        } else if (cli_flag(argv, i, "--estimate")) {
            estimate = 1;
        } else {
            return cli_usage_error("profile", "unknown option \"%s\"", argv[i]);
        }
    }
    if (model_file == NULL || device == NULL)
        return cli_usage_error("profile", "--model and --device are required");
    if (!estimate)
        return cli_usage_error("profile", "measuring on a device is not in this build yet; use "
                                          "--estimate");
    struct model m;
    struct device_table t;
    if (model_load(model_file, &m, &e) || devices_load(devices_file, &t, &e))
        return cli_fail("profile", &e);
    const struct device_spec *d = devices_find(&t, device);
    if (d == NULL) {
        fprintf(stderr, "ballast profile: --device: \"%s\" is not in %s; known devices:", device,
                devices_file);
        for (int k = 0; k < t.n; k++)
            fprintf(stderr, " %s", t.devices[k].name);
        fprintf(stderr, "\n");
        devices_free(&t);
        return ERR_INPUT;
    }
    struct profile p;
    int rc = estimate_profile(&t, d, &m, &p, &e);
    devices_free(&t);
    if (rc)
        return cli_fail("profile", &e);
    if (out_file != NULL) {
        rc = profile_write(out_file, &p, &e);
    } else {
        cJSON *o = profile_to_json(&p);
        char *text = cJSON_Print(o);
        if (text != NULL)
            printf("%s\n", text);
        cJSON_free(text);
        cJSON_Delete(o);
    }
    profile_free(&p);
    return rc ? cli_fail("profile", &e) : ERR_OK;
}
