/* Model names: a bare name is a file of configs/models. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of dir's *.json files, sorted and comma-separated. */
static void list_names(const char *dir, char *out, size_t cap)
{
    char *names[256];
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de = d ? readdir(d) : NULL; de != NULL && n < 256; de = readdir(d)) {
        size_t len = strlen(de->d_name);
        if (len > 5 && strcmp(de->d_name + len - 5, ".json") == 0 &&
            (names[n] = strdup(de->d_name)) != NULL)
            names[n++][len - 5] = '\0';
    }
    if (d != NULL)
        closedir(d);
    qsort(names, (size_t)n, sizeof *names, compare_names);
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < n; k++) {
        used += (size_t)snprintf(out + used, used < cap ? cap - used : 0, "%s%s", k ? ", " : "",
                                 names[k]);
        free(names[k]);
    }
}

int model_find(const char *item, char *path, size_t cap, struct err *e)
{
    const char *dir = BALLAST_SOURCE_DIR "/configs/models";
    if (strchr(item, '/') != NULL || strstr(item, ".json") != NULL) {
        snprintf(path, cap, "%s", item);
        return ERR_OK;
    }
    snprintf(path, cap, "%s/%s.json", dir, item);
    if (access(path, F_OK) == 0)
        return ERR_OK;
    char names[2048];
    list_names(dir, names, sizeof names);
    return err_set(e, ERR_INPUT, "\"%s\" is neither a model file nor a model of %s (known: %s)",
                   item, dir, names);
}
