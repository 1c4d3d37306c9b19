/* A cluster file of several pipelines (cluster.h: "pipelines", heterogeneous replicas): how
 * many, and each as a cluster of its own, read by cluster_parse. Above cluster.c, which reads
 * one pipeline and refuses "pipelines" (cluster_group_no_stages). */
#include <string.h>

#include "cluster.h"
#include "jsonio.h"

static const cJSON *pipelines_of(const cJSON *root, const char *file, int *n, struct err *e)
{
    const cJSON *pipes = cJSON_GetObjectItemCaseSensitive(root, "pipelines");
    *n = 0;
    if (pipes == NULL)
        return NULL;
    if (jsonio_expect_array(pipes, file, "pipelines", e))
        return NULL;
    *n = cJSON_GetArraySize(pipes);
    if (*n < 1 || *n > CLUSTER_STAGES_MAX)
        err_set(e, ERR_INPUT, "%s: pipelines: %d pipelines, expected 1 to %d", file, *n,
                CLUSTER_STAGES_MAX);
    return pipes;
}

int cluster_pipeline_count(const cJSON *root, const char *file, int *n, struct err *e)
{
    pipelines_of(root, file, n, e);
    return e->code;
}

/* The file's members with pipeline k's in place of "pipelines": references to them, not
 * copies (a copy of the whole file per pipeline made many pipelines cost their count times
 * the file). */
static cJSON *pipeline_root(const cJSON *root, const cJSON *pipe, const char *file, int k,
                            struct err *e)
{
    static const char *const keys[] = {"stages", "micro_batches", "link", "reserve_bytes",
                                       "name", NULL};
    static const char *const text[] = {"name", NULL};
    char path[JSONIO_PATH_MAX];
    jsonio_path_index(path, "pipelines", k);
    if (jsonio_expect_object(pipe, file, path, e) ||
        jsonio_check_keys(pipe, file, path, keys, e) ||
        jsonio_check_text(pipe, file, path, text, e))
        return NULL;
    cJSON *out = cJSON_CreateObject();
    int ok = out != NULL;
    for (cJSON *m = root->child; m != NULL && ok; m = m->next)
        if (strcmp(m->string, "pipelines") != 0 &&
            cJSON_GetObjectItemCaseSensitive(pipe, m->string) == NULL)
            ok = cJSON_AddItemReferenceToObject(out, m->string, m);
    for (cJSON *m = pipe->child; m != NULL && ok; m = m->next)
        if (strcmp(m->string, "name") != 0)
            ok = cJSON_AddItemReferenceToObject(out, m->string, m);
    if (!ok) {
        cJSON_Delete(out);
        err_set(e, ERR_FAIL, "out of memory");
        return NULL;
    }
    return out;
}

int cluster_parse_pipeline(const cJSON *root, const char *file, int k, struct cluster *c,
                           struct err *e)
{
    memset(c, 0, sizeof *c);
    int n;
    const cJSON *pipes = pipelines_of(root, file, &n, e);
    if (e->code == ERR_OK && pipes == NULL) {
        cluster_parse(root, file, c, e);
    } else if (e->code == ERR_OK) {
        cJSON *one = pipeline_root(root, cJSON_GetArrayItem(pipes, k), file, k, e);
        struct err inner;
        err_clear(&inner);
        if (one != NULL && cluster_parse(one, file, c, &inner))
            err_set(e, inner.code, "pipelines[%d] of %s", k, inner.msg);
        /* a pipeline reduces its gradients with the others even unreplicated */
        else if (one != NULL && cluster_group_grads(c, e))
            cluster_free(c);
        cJSON_Delete(one);
    }
    return e->code;
}
