/* Helpers for the test programs that read Ballast's JSON files with cJSON (beside testutil.h):
 * the reference side of a test reads files as a user's script would, not through Ballast's
 * loaders. */
#ifndef BALLAST_TESTJSON_H
#define BALLAST_TESTJSON_H

#include <cjson/cJSON.h>

/* The parsed file (caller cJSON_Deletes); a fatal assertion when unreadable or not JSON. */
cJSON *test_read_json(const char *path);
/* The number member `key` of o; a fatal assertion when it is not one. */
double test_num(const cJSON *o, const char *key);
/* `ballast profile --estimate` of the model file `model` on `device`, written once to
 * tmpdir/MODEL-DEVICE.json (MODEL the file's base name); its path, in test_path's slots. */
const char *test_estimated_profile(const char *model, const char *device);
/* The cluster file `cluster` (parsed; caller deletes) with every stage's profile
 * test_estimated_profile's for the model file `model` on the stage's device. */
cJSON *test_cluster_estimated(const char *cluster, const char *model);

/* configs/devices.json without `key` in device `device`'s entry, written to tmpdir; its path,
 * in test_path's slots. */
const char *test_devices_without(const char *device, const char *key);

#endif
