/* `ballast train` reading and writing files other tools make: llm.c token files (--data),
 * against the same tokens given as raw bytes; safetensors weights (--init, --save-weights)
 * on 1 and 3 ranks, per stage and gathered, against each other; and bad files of both kinds
 * refused with the file, the field and the numbers. Files are written here, byte by byte.
 * Runs pin --threads 1. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120

/* vocab 256, so the same tokens can also be given as bytes */
static char plan_bytes[1024];
/* vocab 64, on 1 and 3 stages (embed | blocks | head) */
static char plan_w1[1024], plan_w3[1024];
/* a Llama of vocab 64 on 1 and 3 stages */
static char plan_l1[1024], plan_l3[1024];
static const char llama_text[] =
    "{\"format\": \"ballast-model/1\", \"kind\": \"llama\", \"n_layer\": 2, \"n_embd\": 32, "
    "\"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, \"rope_theta\": 10000, "
    "\"norm_eps\": 1e-5, \"seq_len\": 16, \"vocab_size\": 64, \"micro_batch\": 2, "
    "\"dtype\": \"fp32\"}";

static void put32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {v & 255, v >> 8 & 255, v >> 16 & 255, v >> 24 & 255};
    fwrite(b, 1, 4, f);
}

/* An llm.c token file: header (magic, version, count; the rest zero), then `n` tokens as
 * little-endian uint16 (`n` may differ from `count`, to make a bad file). */
static const char *write_llmc(const char *name, uint32_t magic, uint32_t version, int32_t count,
                              const uint16_t *tok, int n)
{
    const char *path = test_path(name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    put32(f, magic);
    put32(f, version);
    put32(f, (uint32_t)count);
    for (int i = 3; i < 256; i++)
        put32(f, 0);
    for (int i = 0; i < n; i++) {
        unsigned char b[2] = {tok[i] & 255, tok[i] >> 8};
        fwrite(b, 1, 2, f);
    }
    fclose(f);
    return path;
}

#define N_TOK 600
static uint16_t tokens[N_TOK];

static int setup(void)
{
    train_plan_gpt("bytes", 256, "fp32", 1, "none", plan_bytes, sizeof plan_bytes);
    train_plan_gpt("w1", 64, "fp32", 1, "none", plan_w1, sizeof plan_w1);
    train_plan_gpt("w3", 64, "fp32", 3, "none", plan_w3, sizeof plan_w3);
    train_plan_model("l1", llama_text, 1, "none", plan_l1, sizeof plan_l1);
    train_plan_model("l3", llama_text, 3, "none", plan_l3, sizeof plan_l3);
    /* text-like: a walk over 40 byte values with a little structure to learn */
    struct test_rng r = {7};
    for (int i = 0; i < N_TOK; i++)
        tokens[i] = (uint16_t)(i % 3 == 0 ? 'a' + test_rng_int(&r, 0, 25) : 'a' + i % 13);
    return 0;
}

static void expect_refused(const char *args, const char *needle)
{
    char with_threads[4096];
    snprintf(with_threads, sizeof with_threads, "--threads 1 %s", args);
    struct train_run r = train_exec(1, RUN_LIMIT_S, with_threads);
    int found = r.err != NULL && strstr(r.err, needle) != NULL;
    if (r.status != 2 || !found)
        fprintf(stderr, "\n%s: status %d (expected 2), stderr: %s (expected \"%s\")\n", args,
                r.status, r.err ? r.err : "", needle);
    CU_ASSERT_EQUAL(r.status, 2);
    CU_ASSERT(found);
    train_run_free(&r);
}

/* The same token values as an llm.c file and as a file of bytes: the same batches, so
 * bitwise the same losses. */
static void test_llmc_as_bytes(void)
{
    const char *tok_file = write_llmc("text.bin", 20240520, 1, N_TOK, tokens, N_TOK);
    char tok_path[1024], byte_path[1024], extra[4096];
    snprintf(tok_path, sizeof tok_path, "%s", tok_file);
    snprintf(byte_path, sizeof byte_path, "%s", test_path("text.txt"));
    FILE *f = fopen(byte_path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    for (int i = 0; i < N_TOK; i++)
        fputc(tokens[i], f);
    fclose(f);
    struct train_metrics a, b;
    snprintf(extra, sizeof extra, "--threads 1 --steps 4 --data '%s'", tok_path);
    if (train_run_ok(1, RUN_LIMIT_S, plan_bytes, extra, "llmc.json", &a))
        return;
    snprintf(extra, sizeof extra, "--threads 1 --steps 4 --data '%s' --data-format bytes",
             byte_path);
    if (train_run_ok(1, RUN_LIMIT_S, plan_bytes, extra, "bytes.json", &b))
        return;
    CU_ASSERT_EQUAL_FATAL(a.n_steps, 4);
    CU_ASSERT_EQUAL_FATAL(b.n_steps, 4);
    for (int i = 0; i < 4; i++) {
        if (a.loss[i] != b.loss[i])
            fprintf(stderr, "\nstep %d: %.17g (llm.c) against %.17g (bytes)\n", i + 1,
                    a.loss[i], b.loss[i]);
        CU_ASSERT(a.loss[i] == b.loss[i]);
    }
    /* a fresh model predicts about uniformly over 256 tokens, then learns */
    CU_ASSERT(test_close(a.loss[0], log(256.0), 0.2, 0));
    CU_ASSERT(a.loss[3] < a.loss[0]);
    /* and the header's bytes are not tokens: training on the .bin as bytes differs */
    struct train_metrics c;
    snprintf(extra, sizeof extra, "--threads 1 --steps 4 --data '%s' --data-format bytes",
             tok_path);
    if (train_run_ok(1, RUN_LIMIT_S, plan_bytes, extra, "binbytes.json", &c))
        return;
    CU_ASSERT(c.loss[3] != a.loss[3]);
}

static void test_bad_files(void)
{
    char args[4096], needle[2048];
    const char *p;
    /* a text file is not a token file: its header is refused, with what it says */
    snprintf(args, sizeof args, "--plan '%s' --data '%s/README.md'", plan_bytes,
             BALLAST_SOURCE_DIR);
    snprintf(needle, sizeof needle, "%s/README.md: header: magic ", BALLAST_SOURCE_DIR);
    expect_refused(args, needle);
    expect_refused(args, "--data-format bytes");
    p = write_llmc("v2.bin", 20240520, 2, N_TOK, tokens, N_TOK);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    snprintf(needle, sizeof needle, "%s: header: version 2, expected 1", p);
    expect_refused(args, needle);
    /* one token short of its count */
    p = write_llmc("short.bin", 20240520, 1, N_TOK, tokens, N_TOK - 1);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    snprintf(needle, sizeof needle,
             "%s: header: %d tokens, %d bytes with the header, but the file has %d bytes "
             "(truncated)",
             p, N_TOK, 1024 + 2 * N_TOK, 1024 + 2 * (N_TOK - 1));
    expect_refused(args, needle);
    p = write_llmc("long.bin", 20240520, 1, N_TOK - 1, tokens, N_TOK);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    expect_refused(args, "bytes past the last token");
    /* shorter than the header itself */
    p = test_write("tiny.bin", "0123456789");
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    snprintf(needle, sizeof needle, "%s: 10 bytes, but llm.c's token-file header needs 1024", p);
    expect_refused(args, needle);
    /* a token past the vocabulary, named by its offset */
    uint16_t bad[N_TOK];
    memcpy(bad, tokens, sizeof bad);
    bad[37] = 256;
    bad[500] = 60000;
    p = write_llmc("vocab.bin", 20240520, 1, N_TOK, bad, N_TOK);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    snprintf(needle, sizeof needle,
             "%s: token 256 at byte offset %d (token 37) >= the model's vocab_size 256", p,
             1024 + 2 * 37);
    expect_refused(args, needle);
    /* fewer tokens than one sequence (seq_len 16) */
    p = write_llmc("few.bin", 20240520, 1, 16, tokens, 16);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_bytes, p);
    snprintf(needle, sizeof needle, "%s: 16 tokens, but one sequence needs seq_len + 1 = 17", p);
    expect_refused(args, needle);
    /* the option itself */
    snprintf(args, sizeof args, "--plan '%s' --data '%s' --data-format words", plan_bytes, p);
    expect_refused(args, "--data-format: \"words\", expected llmc or bytes");
    snprintf(args, sizeof args, "--plan '%s' --data-format bytes", plan_bytes);
    expect_refused(args, "--data-format needs --data FILE");
}

/* ---- safetensors ---- */

/* A GPT-2 of plan_gpt's shape (C 32, 2 blocks) as Hugging Face saves it: Conv1D weights
 * [in, out], 20 positions (more than seq_len 16), no lm_head.weight (tied to wte). Values
 * uniform, layer norms near 1. Bad variants: `omit` left out; `dtype_of` given `dtype`;
 * c_attn of block 0 in the (out, in) layout. */
struct st_spec {
    char name[64];
    int64_t rows, cols; /* cols 0: a vector */
};

#define T_(nm, r, c) (snprintf(t[n].name, 64, "%s", nm), t[n].rows = r, t[n++].cols = c)

static const char *write_tensors(const char *file, const struct st_spec *t, int n,
                                 const char *omit, const char *dtype_of, const char *dtype);

static const char *write_gpt2(const char *file, const char *omit, const char *dtype_of,
                              const char *dtype, int qkv_out_in)
{
    enum { C = 32, V = 64, P = 20 };
    struct st_spec t[40];
    int n = 0;
    T_("wte.weight", V, C);
    T_("wpe.weight", P, C);
    for (int b = 0; b < 2; b++) {
        static const char *const part[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                           "attn.c_attn.bias", "attn.c_proj.weight",
                                           "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                           "mlp.c_fc.weight", "mlp.c_fc.bias",
                                           "mlp.c_proj.weight", "mlp.c_proj.bias"};
        static const int64_t shape[][2] = {{C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C},
                                           {C, 0}, {C, 0}, {C, 0}, {C, 4 * C}, {4 * C, 0},
                                           {4 * C, C}, {C, 0}};
        for (int k = 0; k < 12; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "h.%d.%s", b, part[k]);
            int flip = qkv_out_in && b == 0 && k == 2;
            T_(nm, flip ? shape[k][1] : shape[k][0], flip ? shape[k][0] : shape[k][1]);
        }
    }
    T_("ln_f.weight", C, 0);
    T_("ln_f.bias", C, 0);
    return write_tensors(file, t, n, omit, dtype_of, dtype);
}

/* A Llama of plan_llama's shape (C 32, 4 query heads of 8 over 2 key/value heads, ffn 48, 2
 * blocks) with LlamaForCausalLM's names; lm_head.weight left out when `tied` (Hugging Face's
 * tied save: it then takes embed_tokens' values). `omit`, `dtype_of`: as write_gpt2's. */
static const char *write_llama(const char *file, int tied, const char *omit,
                               const char *dtype_of, const char *dtype)
{
    enum { C = 32, V = 64, Q = 32, KV = 16, F = 48 };
    struct st_spec t[40];
    int n = 0;
    T_("model.embed_tokens.weight", V, C);
    for (int b = 0; b < 2; b++) {
        static const char *const part[] = {
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight"};
        static const int64_t shape[][2] = {{C, 0}, {Q, C}, {KV, C}, {KV, C}, {C, C},
                                           {C, 0}, {F, C}, {F, C}, {C, F}};
        for (int k = 0; k < 9; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", b, part[k]);
            T_(nm, shape[k][0], shape[k][1]);
        }
    }
    T_("model.norm.weight", C, 0);
    if (!tied)
        T_("lm_head.weight", V, C);
    return write_tensors(file, t, n, omit, dtype_of, dtype);
}
#undef T_

/* Tensors t (values uniform, norms' gains near 1; lm_head.weight a copy of the embedding when
 * there is one, so a tied file holds the same model), F32 unless `dtype_of`. */
static const char *write_tensors(const char *file, const struct st_spec *t, int n,
                                 const char *omit, const char *dtype_of, const char *dtype)
{
    cJSON *h = cJSON_CreateObject();
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (omit && strcmp(t[i].name, omit) == 0)
            continue;
        cJSON *o = cJSON_AddObjectToObject(h, t[i].name), *sh = cJSON_AddArrayToObject(o, "shape"),
              *off = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddStringToObject(o, "dtype",
                                dtype_of && strcmp(t[i].name, dtype_of) == 0 ? dtype : "F32");
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].rows));
        if (t[i].cols)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].cols));
        int64_t bytes = 4 * t[i].rows * (t[i].cols ? t[i].cols : 1);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + bytes)));
        at += bytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    const char *path = test_path(file);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint64_t len = strlen(text);
    for (int b = 0; b < 8; b++)
        fputc((int)(len >> (8 * b) & 255), f);
    fputs(text, f);
    free(text);
    struct test_rng r = {11};
    for (int i = 0; i < n; i++) {
        if (omit && strcmp(t[i].name, omit) == 0)
            continue;
        int norm = (strstr(t[i].name, "ln_") != NULL || strstr(t[i].name, "norm") != NULL) &&
                   strstr(t[i].name, ".weight") != NULL;
        if (strcmp(t[i].name, "lm_head.weight") == 0)
            r.s = 11; /* the embedding's values again: it is the first tensor */
        for (int64_t j = 0; j < t[i].rows * (t[i].cols ? t[i].cols : 1); j++) {
            float v = (float)((norm ? 1.0 : 0.0) + test_rng_double(&r, -0.08, 0.08));
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    return path;
}

static int run_losses(int np, const char *plan, const char *extra, const char *metrics,
                      struct train_metrics *m)
{
    char args[4096];
    snprintf(args, sizeof args, "--threads 1 %s", extra);
    return train_run_ok(np, RUN_LIMIT_S, plan, args, metrics, m);
}

static int same(const struct train_metrics *a, const struct train_metrics *b, int steps)
{
    int ok = a->n_steps == steps && b->n_steps == steps;
    for (int i = 0; ok && i < steps; i++)
        if (a->loss[i] != b->loss[i]) {
            fprintf(stderr, "\nstep %d: loss %.17g against %.17g\n", i + 1, a->loss[i],
                    b->loss[i]);
            ok = 0;
        }
    return ok;
}

/* Weights in from `w0` on 1 and 3 ranks give the same losses; weights out, gathered
 * (TAG-a.safetensors) or per stage (TAG-c-{stage}.safetensors), are the same bytes and start
 * the same runs again. *ma: the 1-rank run's losses. 0 when every run ran. */
static int round_trip(const char *tag, const char *w0, const char *plan1, const char *plan3,
                      struct train_metrics *ma)
{
    char a[1024], b[1024], c[1024], extra[4096], name[64];
    snprintf(name, sizeof name, "%s-a.safetensors", tag);
    snprintf(a, sizeof a, "%s", test_path(name));
    snprintf(name, sizeof name, "%s-b.safetensors", tag);
    snprintf(b, sizeof b, "%s", test_path(name));
    snprintf(name, sizeof name, "%s-c-{stage}.safetensors", tag);
    snprintf(c, sizeof c, "%s", test_path(name));
    struct train_metrics mb, mc, md, me, seeded;
    snprintf(extra, sizeof extra, "--steps 3 --init '%s' --save-weights '%s'", w0, a);
    if (run_losses(1, plan1, extra, "wa.json", ma))
        return -1;
    snprintf(extra, sizeof extra, "--steps 3 --init '%s' --save-weights '%s'", w0, b);
    if (run_losses(3, plan3, extra, "wb.json", &mb))
        return -1;
    snprintf(extra, sizeof extra, "--steps 3 --init '%s' --save-weights '%s'", w0, c);
    if (run_losses(3, plan3, extra, "wc.json", &mc))
        return -1;
    CU_ASSERT(same(ma, &mb, 3));
    CU_ASSERT(same(ma, &mc, 3));
    CU_ASSERT(train_files_equal(a, b)); /* rank 0 gathered what one rank holds */
    /* the weights came from the file: the seed's own weights give other losses */
    if (run_losses(1, plan1, "--steps 3", "wseed.json", &seeded))
        return -1;
    CU_ASSERT(seeded.loss[0] != ma->loss[0]);
    /* the saved weights start a run again: one file on 1 rank, a file per stage on 3 */
    snprintf(extra, sizeof extra, "--steps 2 --init '%s'", a);
    if (run_losses(1, plan1, extra, "wd.json", &md))
        return -1;
    snprintf(extra, sizeof extra, "--steps 2 --init '%s'", c);
    if (run_losses(3, plan3, extra, "we.json", &me))
        return -1;
    CU_ASSERT(same(&md, &me, 2));
    CU_ASSERT(md.loss[0] != ma->loss[0]); /* trained weights, not the file's first ones */
    return 0;
}

static void test_weights_round_trip(void)
{
    char w0[1024];
    snprintf(w0, sizeof w0, "%s", write_gpt2("w0.safetensors", NULL, NULL, NULL, 0));
    struct train_metrics ma;
    if (round_trip("gpt", w0, plan_w1, plan_w3, &ma))
        return;
    /* and per-stage files hold their stage's tensors only: stage 0 the embeddings */
    char s0[1024];
    snprintf(s0, sizeof s0, "%s", test_path("gpt-c-0.safetensors"));
    char *text = test_read(s0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strstr(text + 8, "\"wte.weight\"") != NULL);
    CU_ASSERT(strstr(text + 8, "\"ln_f.weight\"") == NULL);
    free(text);
}

static void test_weights_refused(void)
{
    char args[4096], needle[2048];
    const char *p;
    p = write_gpt2("missing.safetensors", "h.1.ln_2.bias", NULL, NULL, 0);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_w1, p);
    snprintf(needle, sizeof needle, "%s: h.1.ln_2.bias: missing", p);
    expect_refused(args, needle);
    p = write_gpt2("layout.safetensors", NULL, NULL, NULL, 1);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_w1, p);
    snprintf(needle, sizeof needle,
             "%s: h.0.attn.c_attn.weight.shape: [96, 32], expected [32, 96]", p);
    expect_refused(args, needle);
    p = write_gpt2("f64.safetensors", NULL, "wpe.weight", "F64", 0);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_w1, p);
    snprintf(needle, sizeof needle, "%s: wpe.weight.dtype: \"F64\", expected F32, BF16 or F16",
             p);
    expect_refused(args, needle);
    /* truncated: the last tensor's bytes run past the end */
    char cut[1024];
    snprintf(cut, sizeof cut, "%s", write_gpt2("cut.safetensors", NULL, NULL, NULL, 0));
    CU_ASSERT_EQUAL(truncate(cut, 3000), 0);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_w1, cut);
    expect_refused(args, "(truncated)");
    /* a header length past the file: not safetensors at all */
    snprintf(args, sizeof args, "--plan '%s' --init '%s/README.md'", plan_w1,
             BALLAST_SOURCE_DIR);
    snprintf(needle, sizeof needle, "%s/README.md: header length ", BALLAST_SOURCE_DIR);
    expect_refused(args, needle);
    expect_refused(args, "runs past the file's");
    snprintf(args, sizeof args, "--plan '%s' --init '%s' --resume '%s'", plan_w1, cut, cut);
    expect_refused(args, "--init and --resume");
}

/* The file's header (cJSON_Delete), NULL if it is not safetensors. */
static cJSON *st_header(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char len[8];
    if (f == NULL || fread(len, 1, 8, f) != 8) {
        if (f)
            fclose(f);
        return NULL;
    }
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--)
        n = n << 8 | len[b];
    char *text = malloc(n + 1);
    cJSON *h = NULL;
    if (text != NULL && fread(text, 1, n, f) == n) {
        text[n] = 0;
        h = cJSON_Parse(text);
    }
    free(text);
    fclose(f);
    return h;
}

/* `saved` names exactly `want`'s tensors (less __metadata__), with their shapes, as F32. */
static void expect_same_tensors(const char *saved, const char *want)
{
    cJSON *a = st_header(saved), *b = st_header(want), *o;
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(cJSON_GetArraySize(a), cJSON_GetArraySize(b) + 1 -
                                               cJSON_HasObjectItem(b, "__metadata__"));
    cJSON_ArrayForEach(o, b)
    {
        cJSON *got = cJSON_GetObjectItemCaseSensitive(a, o->string);
        CU_ASSERT_PTR_NOT_NULL(got);
        if (got == NULL) {
            fprintf(stderr, "\n%s: %s missing\n", saved, o->string);
            continue;
        }
        CU_ASSERT(cJSON_Compare(cJSON_GetObjectItem(got, "shape"),
                                cJSON_GetObjectItem(o, "shape"), 1));
        CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(got, "dtype")->valuestring, "F32");
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* A Llama's weights by Hugging Face's names: round_trip's, the saved file with the same
 * names and shapes as the one read, and a tied file (no lm_head.weight) the same model. The
 * values' mapping (q, k, v and gate, up row blocks) is checked against PyTorch by
 * tests/torch/test_numerics_torch.py --kind llama. */
static void test_llama_weights(void)
{
    char w0[1024], wt[1024], extra[4096];
    snprintf(w0, sizeof w0, "%s", write_llama("l0.safetensors", 0, NULL, NULL, NULL));
    snprintf(wt, sizeof wt, "%s", write_llama("ltied.safetensors", 1, NULL, NULL, NULL));
    struct train_metrics ma, mt;
    if (round_trip("llama", w0, plan_l1, plan_l3, &ma))
        return;
    expect_same_tensors(test_path("llama-a.safetensors"), w0);
    snprintf(extra, sizeof extra, "--steps 3 --init '%s'", wt);
    if (run_losses(1, plan_l1, extra, "lt.json", &mt))
        return;
    CU_ASSERT(same(&ma, &mt, 3));
    /* bad Llama files name the tensor */
    char args[4096], needle[2048];
    const char *p = write_llama("lmiss.safetensors", 0, "model.layers.1.self_attn.k_proj.weight",
                                NULL, NULL);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_l1, p);
    snprintf(needle, sizeof needle, "%s: model.layers.1.self_attn.k_proj.weight: missing", p);
    expect_refused(args, needle);
    p = write_llama("lf64.safetensors", 0, NULL, "model.layers.0.mlp.up_proj.weight", "F64");
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_l1, p);
    snprintf(needle, sizeof needle,
             "%s: model.layers.0.mlp.up_proj.weight.dtype: \"F64\", expected F32, BF16 or F16",
             p);
    expect_refused(args, needle);
    /* a GPT-2 file is not a Llama's */
    p = write_gpt2("gpt-for-llama.safetensors", NULL, NULL, NULL, 0);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_l1, p);
    snprintf(needle, sizeof needle, "%s: model.embed_tokens.weight: missing", p);
    expect_refused(args, needle);
}

/* ---- issue 27: the data file while training, and bounded readers ---- */

/* An llm.c file of `n` tokens, a repeating pattern below 64, written a block at a time. */
static const char *write_many(const char *name, int64_t n)
{
    const char *path = test_path(name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    put32(f, 20240520);
    put32(f, 1);
    put32(f, (uint32_t)n);
    for (int i = 3; i < 256; i++)
        put32(f, 0);
    unsigned char block[4096];
    for (int i = 0; i < 2048; i++) {
        block[2 * i] = (unsigned char)((i * 7 + 3) % 64);
        block[2 * i + 1] = 0;
    }
    for (int64_t at = 0; at < n; at += 2048)
        fwrite(block, 2, (size_t)(n - at < 2048 ? n - at : 2048), f);
    fclose(f);
    return path;
}

/* Issue 27: cut short under a running job, the data file was a SIGBUS (it was mapped); now
 * the rank reading it names it and every rank stops with status 1. */
static void test_data_cut_while_training(void)
{
    char file[1024], args[4096];
    snprintf(file, sizeof file, "%s", write_many("cut.bin", 1 << 20));
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 1000000 --data '%s'", plan_w3,
             file);
    struct train_job j;
    train_job_start(&j, "cut", 3, RUN_LIMIT_S, "", args);
    CU_ASSERT_FATAL(train_job_saw(&j, "step 2/", 60));
    CU_ASSERT_FATAL(truncate(file, 1024 + 64) == 0);
    train_job_wait(&j, RUN_LIMIT_S);
    char needle[1200];
    snprintf(needle, sizeof needle, "--data %s: changed while training", file);
    int ok = j.code == 1 && j.text != NULL && strstr(j.text, needle) != NULL &&
             strstr(j.text, "Bus error") == NULL;
    CU_ASSERT(ok);
    if (!ok)
        fprintf(stderr, "\ncut data file: status %d, stderr:\n%s\n", j.code,
                j.text ? j.text : "");
    train_job_free(&j);
}

/* The largest resident set of `cmd`'s processes, in KiB (-1 when it failed). */
static long peak_rss_kib(const char *cmd)
{
    const char *out = test_path("rss.txt");
    pid_t p = fork();
    if (p == 0) { /* the children's peak is the largest of any descendant waited for */
        int rc = system(cmd);
        struct rusage ru;
        getrusage(RUSAGE_CHILDREN, &ru);
        FILE *f = fopen(out, "w");
        if (f != NULL)
            fprintf(f, "%ld\n", rc == 0 ? ru.ru_maxrss : -1L);
        if (f != NULL)
            fclose(f);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    char *text = test_read(out);
    long kib = text != NULL ? atol(text) : -1;
    free(text);
    return kib;
}

/* Issue 27: every rank read the whole data file through a mapping (a 4.3 GB file: 4.4 GB
 * resident on each); now rank 0 reads it a piece at a time and the others only open it. The
 * reference: the same run on the synthetic source. A 256 MiB file (sparse: its tokens are 0)
 * adds less than a tenth of itself to the largest rank. */
static void test_data_memory_bounded(void)
{
    const char *big = test_path("big.bin");
    int64_t n = (int64_t)128 << 20; /* tokens: 256 MiB */
    FILE *f = fopen(big, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    put32(f, 20240520);
    put32(f, 1);
    put32(f, (uint32_t)n);
    fclose(f);
    CU_ASSERT_FATAL(truncate(big, 1024 + 2 * n) == 0);
    char cmd[4096];
    const char *run = "timeout -k 5 %d mpirun --allow-run-as-root --oversubscribe -np 3 '%s' "
                      "train --plan '%s' --threads 1 --steps 1 --quiet %s%s%s > /dev/null 2>&1";
    snprintf(cmd, sizeof cmd, run, RUN_LIMIT_S, BALLAST_EXE, plan_w3, "", "", "");
    long base = peak_rss_kib(cmd);
    snprintf(cmd, sizeof cmd, run, RUN_LIMIT_S, BALLAST_EXE, plan_w3, "--data '", big, "'");
    long with = peak_rss_kib(cmd);
    fprintf(stderr, "\n  peak resident: %ld KiB synthetic, %ld KiB with a 256 MiB data file\n",
            base, with);
    CU_ASSERT(base > 0 && with > 0);
    CU_ASSERT(with - base < (256 << 10) / 10);
    unlink(big);
}

/* Issue 27: a header length over Hugging Face's cap is refused before the header is read
 * (here a sparse file of 100 MB of zeros: once parsed as JSON, now refused by its length);
 * a crafted shape whose byte count overflows is refused by checked arithmetic (once UBSan's
 * signed overflow). */
static void test_safetensors_bounds(void)
{
    char args[4096], needle[2048], path[1024];
    snprintf(path, sizeof path, "%s", test_path("huge-header.safetensors"));
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint64_t len = 100000001;
    for (int b = 0; b < 8; b++)
        fputc((int)(len >> (8 * b) & 255), f);
    fclose(f);
    CU_ASSERT_FATAL(truncate(path, 8 + (off_t)len + 8) == 0);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan_w1, path);
    snprintf(needle, sizeof needle, "%s: header length 100000001, over the 100000000 bytes",
             path);
    expect_refused(args, needle);
    unlink(path);
    /* wpe of 8e15 positions (the file may hold more than the model uses) of n_embd 512:
     * 4.1e18 elements, 1.6e19 bytes */
    char plan[1024];
    train_plan_model("wide", "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", "
                             "\"n_layer\": 1, \"n_embd\": 512, \"n_head\": 8, \"seq_len\": 16, "
                             "\"vocab_size\": 64, \"micro_batch\": 1, \"dtype\": \"fp32\"}",
                     1, "none", plan, sizeof plan);
    const char *head = "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[64,512],"
                       "\"data_offsets\":[0,131072]},\"wpe.weight\":{\"dtype\":\"F32\","
                       "\"shape\":[8000000000000000,512],\"data_offsets\":[131072,131076]}}";
    snprintf(path, sizeof path, "%s", test_path("crafted.safetensors"));
    f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    len = strlen(head);
    for (int b = 0; b < 8; b++)
        fputc((int)(len >> (8 * b) & 255), f);
    fputs(head, f);
    for (int i = 0; i < 131076; i++)
        fputc(0, f);
    fclose(f);
    snprintf(args, sizeof args, "--plan '%s' --init '%s'", plan, path);
    snprintf(needle, sizeof needle,
             "%s: wpe.weight.shape: [8000000000000000, 512] holds more bytes than a file can",
             path);
    expect_refused(args, needle);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_files", setup, NULL);
    CU_add_test(s, "an llm.c token file trains as its tokens given as bytes", test_llmc_as_bytes);
    CU_add_test(s, "bad token files are refused with file, field and numbers", test_bad_files);
    CU_add_test(s, "safetensors in and out on 1 and 3 ranks, gathered and per stage",
                test_weights_round_trip);
    CU_add_test(s, "bad safetensors files are refused with file and field",
                test_weights_refused);
    CU_add_test(s, "Llama safetensors (Hugging Face names) in and out on 1 and 3 ranks",
                test_llama_weights);
    CU_add_test(s, "a data file cut short while training: named, status 1, no SIGBUS",
                test_data_cut_while_training);
    CU_add_test(s, "a large data file costs a bounded few MiB, not its size",
                test_data_memory_bounded);
    CU_add_test(s, "a safetensors header over the cap and a crafted shape are refused",
                test_safetensors_bounds);
    return test_main();
}
