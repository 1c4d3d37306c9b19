#include "ckpt.h"

#include <dirent.h>
#include <fcntl.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "hash.h"
#include "jsonio.h"
#include "progress.h"

#define CKPT_MAGIC "BALLASTK"
#define CKPT_VERSION 1
#define CKPT_CHUNK ((int64_t)1 << 22)

/* Host byte order; fixed-width fields, no padding (checked below). */
struct ckpt_header {
    char magic[8];
    uint32_t version, header_bytes;
    int32_t n_layer, n_embd, n_head, seq_len, vocab_size, micro_batch, dtype;
    int32_t n_stages, stage, first, last, micro_batches, data_kind, unused;
    uint64_t seed, data_bytes, data_hash;
    int64_t step, section_bytes, payload_bytes;
};
_Static_assert(sizeof(struct ckpt_header) == 16 + 14 * 4 + 6 * 8, "ckpt_header has padding");


void ckpt_identity_of(struct ckpt_identity *id, const struct stage_runner *r,
                      const struct data_source *d, uint64_t seed)
{
    memset(id, 0, sizeof *id);
    id->model = *r->c.model;
    id->n_stages = r->c.n_stages;
    id->stage = r->c.stage;
    id->first = r->c.first;
    id->last = r->c.last;
    id->micro_batches = r->c.micro_batches;
    id->seed = seed;
    id->data_kind = (int)d->kind;
    id->data_bytes = d->kind == DATA_FILE ? (uint64_t)d->n_bytes : 0;
    id->data_hash = d->hash;
    id->section_bytes = r->lay.section_bytes;
    id->persistent_bytes = stage_state_bytes(r);
}

static void stage_file(char *out, size_t cap, const char *dir, int stage, int64_t step)
{
    snprintf(out, cap, "%s/stage-%d-step-%lld.ckpt", dir, stage, (long long)step);
}

int ckpt_check_dir(const char *dir, struct err *e)
{
    char manifest[FILEIO_PATH_MAX + 32];
    if (snprintf(manifest, sizeof manifest, "%s/checkpoint.json", dir) >= (int)sizeof manifest)
        return err_set(e, ERR_INPUT, "%s: path too long", dir);
    /* the path is the user's: a bad one is bad input (ERR_INPUT throughout) */
    return fileio_make_dirs(dir, e) || fileio_dir_check(dir, e) || fileio_out_check(manifest, e)
               ? e->code
               : ERR_OK;
}

int ckpt_write_stage(const char *dir, const struct ckpt_identity *id, int64_t step,
                     struct stage_runner *r, struct err *e)
{
    char file[4200];
    if (fileio_make_dirs(dir, e)) /* checked at the start: failing now is the run's failure */
        return e->code = ERR_FAIL;
    stage_file(file, sizeof file, dir, id->stage, step);
    struct ckpt_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = sizeof h;
    h.n_layer = id->model.n_layer;
    h.n_embd = id->model.n_embd;
    h.n_head = id->model.n_head;
    h.seq_len = id->model.seq_len;
    h.vocab_size = id->model.vocab_size;
    h.micro_batch = id->model.micro_batch;
    h.dtype = (int32_t)id->model.dtype;
    h.n_stages = id->n_stages;
    h.stage = id->stage;
    h.first = id->first;
    h.last = id->last;
    h.micro_batches = id->micro_batches;
    h.data_kind = id->data_kind;
    h.seed = id->seed;
    h.data_bytes = id->data_bytes;
    h.data_hash = id->data_hash;
    h.step = step;
    h.section_bytes = id->section_bytes;
    h.payload_bytes = id->persistent_bytes;

    struct fileio_out out;
    if (fileio_out_open(&out, file, e))
        return e->code;
    char *buf = malloc((size_t)CKPT_CHUNK);
    int ok = buf != NULL && fileio_write_all(out.fd, &h, sizeof h) == 0;
    uint64_t sum = hash_fnv1a(HASH_FNV1A_START, &h, sizeof h);
    for (int64_t off = 0; ok && off < h.payload_bytes; off += CKPT_CHUNK) {
        int64_t n = h.payload_bytes - off < CKPT_CHUNK ? h.payload_bytes - off : CKPT_CHUNK;
        if (stage_state_get(r, off, buf, n, e)) {
            free(buf);
            fileio_out_discard(&out);
            return e->code;
        }
        struct err bad;
        if (stage_state_check(r, off, buf, n, &bad)) {
            free(buf);
            fileio_out_discard(&out);
            return err_set(e, ERR_FAIL, "%s: not written: %s", file, bad.msg);
        }
        sum = hash_fnv1a(sum, buf, n);
        ok = fileio_write_all(out.fd, buf, n) == 0;
        progress_tick();
    }
    free(buf);
    ok = ok && fileio_write_all(out.fd, &sum, sizeof sum) == 0;
    /* the commit syncs the directory: the manifest names the file only once it is on disk */
    return fileio_out_commit(&out, file, ok, e);
}

int ckpt_write_manifest(const char *dir, int64_t step, int n_stages, const struct lossscale *ls,
                        struct err *e)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/checkpoint.json", dir);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-checkpoint/1");
    jsonio_add_int(o, "step", step);
    cJSON_AddNumberToObject(o, "n_stages", n_stages);
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    for (int s = 0; s < n_stages; s++) {
        char name[128];
        snprintf(name, sizeof name, "stage-%d-step-%lld.ckpt", s, (long long)step);
        cJSON_AddItemToArray(files, cJSON_CreateString(name));
    }
    if (ls != NULL) {
        cJSON *s = cJSON_AddObjectToObject(o, "loss_scale");
        cJSON_AddNumberToObject(s, "scale", ls->scale); /* a float: the double prints it exactly */
        jsonio_add_int(s, "growth_tracker", ls->growth_tracker);
        jsonio_add_int(s, "hysteresis_tracker", ls->hysteresis_tracker);
        jsonio_add_int(s, "skipped_steps", ls->skipped);
    }
    int rc = jsonio_write(file, o, e);
    cJSON_Delete(o);
    return rc;
}

/* Whether `name` is one of this stage's files (*step its step) or their temporaries
 * (*temporary: `<file>.tmp.<pid>.<suffix>`, fileio.h). */
static int stage_entry(const char *name, int stage, long long *step, int *temporary)
{
    char prefix[64], tail[256];
    snprintf(prefix, sizeof prefix, "stage-%d-step-", stage);
    size_t np = strlen(prefix);
    if (strncmp(name, prefix, np) != 0 || sscanf(name + np, "%lld%255s", step, tail) != 2)
        return 0;
    *temporary = strncmp(tail, ".ckpt.tmp.", 10) == 0;
    return *temporary || strcmp(tail, ".ckpt") == 0;
}

/* Removes this stage's files of `step` (all but `step` when `others`), and with `temps` its
 * temporaries of any step. */
static void remove_entries(const char *dir, int stage, int64_t step, int others, int temps)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long long s;
        int temporary;
        if (!stage_entry(ent->d_name, stage, &s, &temporary) ||
            (temporary ? !temps : (s == step) == others))
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        unlink(path);
    }
    closedir(d);
}

void ckpt_remove_older(const char *dir, int stage, int64_t keep)
{
    remove_entries(dir, stage, keep, 1, 1);
}

void ckpt_remove_step(const char *dir, int stage, int64_t step)
{
    remove_entries(dir, stage, step, 0, 0);
}

/* The manifest's "loss_scale" (ckpt.h), each field in the range the scaler keeps it in. */
static int read_loss_scale(const cJSON *o, const char *file, struct lossscale *ls, struct err *e)
{
    double scale;
    ERR_TRY(jsonio_expect_object(o, file, "loss_scale", e));
    ERR_TRY(jsonio_num(o, file, "loss_scale", "scale", 0, FLT_MAX, &scale, e));
    ERR_TRY(jsonio_int(o, file, "loss_scale", "growth_tracker", 0, JSONIO_INT_MAX,
                       &ls->growth_tracker, e));
    ERR_TRY(jsonio_int(o, file, "loss_scale", "hysteresis_tracker", -JSONIO_INT_MAX,
                       JSONIO_INT_MAX, &ls->hysteresis_tracker, e));
    ERR_TRY(jsonio_int(o, file, "loss_scale", "skipped_steps", 0, JSONIO_INT_MAX, &ls->skipped,
                       e));
    if (!(scale > 0) || (double)(float)scale != scale)
        return err_set(e, ERR_INPUT, "%s: loss_scale.scale: %.17g, expected an fp32 value above "
                       "0", file, scale);
    ls->scale = (float)scale;
    return ERR_OK;
}

int ckpt_read_manifest(const char *dir, int64_t *step, int *n_stages, struct lossscale *ls,
                       int *has_ls, struct err *e)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/checkpoint.json", dir);
    cJSON *o = jsonio_read_kind(file, JSONIO_CHECKPOINT, e);
    if (o == NULL)
        return e->code;
    int64_t s = 0;
    int rc = jsonio_check_format(o, file, "checkpoint", 1, e);
    if (rc == ERR_OK)
        rc = jsonio_int(o, file, "", "step", 1, JSONIO_INT_MAX, step, e);
    if (rc == ERR_OK)
        rc = jsonio_int(o, file, "", "n_stages", 1, CLUSTER_STAGES_MAX, &s, e);
    const cJSON *scaler = cJSON_GetObjectItemCaseSensitive(o, "loss_scale");
    *has_ls = scaler != NULL;
    if (rc == ERR_OK && scaler != NULL)
        rc = read_loss_scale(scaler, file, ls, e);
    *n_stages = (int)s;
    cJSON_Delete(o);
    return rc;
}

static int read_all(FILE *f, void *p, int64_t n)
{
    return fread(p, 1, (size_t)n, f) == (size_t)n ? 0 : -1;
}

static const char *data_name(int kind)
{
    return kind == DATA_FILE ? "a data file" : "the synthetic source";
}

static int check_identity(const char *file, const struct ckpt_header *h,
                          const struct ckpt_identity *id, struct err *e)
{
    const struct model *m = &id->model;
    if (h->n_layer != m->n_layer || h->n_embd != m->n_embd || h->n_head != m->n_head ||
        h->seq_len != m->seq_len || h->vocab_size != m->vocab_size ||
        h->micro_batch != m->micro_batch || h->dtype != (int32_t)m->dtype)
        return err_set(e, ERR_INPUT,
                       "%s: written for another model (n_layer %d, n_embd %d, n_head %d, "
                       "seq_len %d, vocab_size %d, micro_batch %d); the plan's model has "
                       "n_layer %d, n_embd %d, n_head %d, seq_len %d, vocab_size %d, "
                       "micro_batch %d",
                       file, h->n_layer, h->n_embd, h->n_head, h->seq_len, h->vocab_size,
                       h->micro_batch, m->n_layer, m->n_embd, m->n_head, m->seq_len,
                       m->vocab_size, m->micro_batch);
    if (h->n_stages != id->n_stages || h->stage != id->stage || h->first != id->first ||
        h->last != id->last)
        return err_set(e, ERR_INPUT,
                       "%s: written for another stage split (stage %d of %d, layers %d-%d); the "
                       "plan's stage %d of %d holds layers %d-%d",
                       file, h->stage, h->n_stages, h->first, h->last, id->stage, id->n_stages,
                       id->first, id->last);
    if (h->micro_batches != id->micro_batches)
        return err_set(e, ERR_INPUT,
                       "%s: written with %d micro-batches per step; the plan has %d", file,
                       h->micro_batches, id->micro_batches);
    if (h->seed != id->seed)
        return err_set(e, ERR_INPUT, "%s: written with --seed %llu; this run has --seed %llu",
                       file, (unsigned long long)h->seed, (unsigned long long)id->seed);
    if (h->data_kind != id->data_kind || h->data_bytes != id->data_bytes ||
        h->data_hash != id->data_hash)
        return err_set(e, ERR_INPUT,
                       "%s: written training on %s (%llu bytes, hash %016llx); this run trains "
                       "on %s (%llu bytes, hash %016llx)",
                       file, data_name(h->data_kind), (unsigned long long)h->data_bytes,
                       (unsigned long long)h->data_hash, data_name(id->data_kind),
                       (unsigned long long)id->data_bytes, (unsigned long long)id->data_hash);
    if (h->section_bytes != id->section_bytes)
        return err_set(e, ERR_INPUT, "%s: %lld bytes of parameters per copy; this stage has %lld",
                       file, (long long)h->section_bytes, (long long)id->section_bytes);
    if (h->payload_bytes != id->persistent_bytes)
        return err_set(e, ERR_INPUT, "%s: %lld bytes of state; this stage has %lld", file,
                       (long long)h->payload_bytes, (long long)id->persistent_bytes);
    return ERR_OK;
}

/* The header of a stage file of `size` bytes read into h: the magic, this build's version,
 * and a payload that the size holds (with the 8-byte checksum after it). */
static int read_ckpt_header(FILE *f, const char *file, int64_t size, struct ckpt_header *h,
                       struct err *e)
{
    if (size < (int64_t)sizeof *h || read_all(f, h, sizeof *h) != 0 ||
        memcmp(h->magic, CKPT_MAGIC, 8) != 0)
        return err_set(e, ERR_INPUT, "%s: not a Ballast checkpoint (no %s header)", file,
                       CKPT_MAGIC);
    if (h->version != CKPT_VERSION || h->header_bytes != sizeof *h)
        return err_set(e, ERR_INPUT, "%s: checkpoint version %u, this build reads version %d",
                       file, h->version, CKPT_VERSION);
    /* compared without adding to the header's number: a crafted one may be near 2^63 */
    if (h->payload_bytes != size - (int64_t)sizeof *h - 8)
        return err_set(e, ERR_INPUT,
                       "%s: %lld bytes, but its header promises %lld bytes of state after its "
                       "%d-byte header, and an 8-byte checksum (truncated or damaged)",
                       file, (long long)size, (long long)h->payload_bytes, (int)sizeof *h);
    return ERR_OK;
}

/* The payload after the header, hashed, against the checksum stored after it. */
static int check_sum(FILE *f, char *buf, const char *file, const struct ckpt_header *h,
                     struct err *e)
{
    uint64_t sum = hash_fnv1a(HASH_FNV1A_START, h, sizeof *h), stored = 0;
    for (int64_t off = 0; off < h->payload_bytes; off += CKPT_CHUNK) {
        int64_t n = h->payload_bytes - off < CKPT_CHUNK ? h->payload_bytes - off : CKPT_CHUNK;
        if (read_all(f, buf, n) != 0)
            return err_set(e, ERR_INPUT, "%s: read error at byte %lld", file,
                           (long long)(sizeof *h + off));
        sum = hash_fnv1a(sum, buf, n);
        progress_tick();
    }
    if (read_all(f, &stored, sizeof stored) != 0)
        return err_set(e, ERR_INPUT, "%s: cannot read the checksum", file);
    if (stored != sum)
        return err_set(e, ERR_INPUT,
                       "%s: damaged: checksum %016llx, but the contents hash to %016llx", file,
                       (unsigned long long)stored, (unsigned long long)sum);
    return ERR_OK;
}

/* The checked payload, read again from after the header into the stage's state, each piece
 * checked by the stage first. */
static int load_payload(FILE *f, char *buf, const char *file, const struct ckpt_header *h,
                        struct stage_runner *r, struct err *e)
{
    struct err bad;
    if (fseek(f, (long)sizeof *h, SEEK_SET) != 0)
        return err_set(e, ERR_INPUT, "%s: cannot seek", file);
    for (int64_t off = 0; off < h->payload_bytes; off += CKPT_CHUNK) {
        int64_t n = h->payload_bytes - off < CKPT_CHUNK ? h->payload_bytes - off : CKPT_CHUNK;
        if (read_all(f, buf, n) != 0)
            return err_set(e, ERR_INPUT, "%s: read error at byte %lld", file,
                           (long long)(sizeof *h + off));
        if (stage_state_check(r, off, buf, n, &bad))
            return err_set(e, ERR_INPUT, "%s: %s", file, bad.msg);
        if (stage_state_put(r, off, buf, n, e))
            return e->code;
        progress_tick();
    }
    return ERR_OK;
}

int ckpt_read_stage(const char *dir, const struct ckpt_identity *id, int64_t step,
                    struct stage_runner *r, struct err *e)
{
    char file[4200];
    stage_file(file, sizeof file, dir, id->stage, step);
    int fd;
    int64_t size;
    if (fileio_open_input(file, 0, &fd, &size, e))
        return err_append(e, "(the manifest %s/checkpoint.json names step %lld)", dir,
                          (long long)step);
    FILE *f = fdopen(fd, "rb");
    char *buf = malloc((size_t)CKPT_CHUNK);
    if (f == NULL || buf == NULL) {
        free(buf);
        f != NULL ? fclose(f) : close(fd);
        return err_set(e, ERR_FAIL, "out of memory reading %s", file);
    }
    struct ckpt_header h;
    int rc = read_ckpt_header(f, file, size, &h, e) || check_sum(f, buf, file, &h, e) ? e->code
                                                                                 : ERR_OK;
    if (rc == ERR_OK && h.step != step)
        rc = err_set(e, ERR_INPUT, "%s: holds step %lld, the manifest names step %lld", file,
                     (long long)h.step, (long long)step);
    if (rc == ERR_OK)
        rc = check_identity(file, &h, id, e);
    if (rc == ERR_OK) /* checked: now load */
        rc = load_payload(f, buf, file, &h, r, e);
    free(buf);
    fclose(f);
    return rc;
}
