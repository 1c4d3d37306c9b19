/* `ballast check`: a user's framework configuration read into what it amounts to on a
 * pipeline (check_read.c). Megatron-LM's command line, NeMo's overrides or YAML file,
 * FlagScale's YAML file and ColossalAI's plugin keywords are each read as key = value pairs,
 * their keys mapped to Megatron-LM's names (the exporters' tables read backwards), and read
 * once as such. */
#ifndef BALLAST_CHECK_READ_H
#define BALLAST_CHECK_READ_H

#include "err.h"
#include "model.h"

#define CHECK_STAGES_MAX 4096

struct check_config {
    int pp, tp;                         /* 1 when not given */
    int n_blocks;                       /* per stage given: blocks[]; 0: the framework's even split */
    int blocks[CHECK_STAGES_MAX];
    int first, last;                    /* -1: not given (the first and last stage's blocks) */
    char granularity[16];               /* "", "full" or "selective" */
    int recompute_num_layers;           /* full: every stage's first N (-1: not given) */
    unsigned modules;                   /* selective: FW_MODULE_* */
    int n_per_stage;                    /* full, per stage: recompute[] (FlagScale, ColossalAI) */
    int recompute[CHECK_STAGES_MAX];
    int all_blocks;                     /* ColossalAI's GPT-2: every block of every stage */
    int micro_batch, global_batch, micro_batches; /* 0: not given */
    int dtype_given;
    enum model_dtype dtype;
    int attention_given;
    enum model_attention attention;
    int host_optimizer, shard;
    double dropout;                     /* the largest dropout given (Megatron-LM's default 0.1) */
    int num_layers, hidden_size, num_heads, ffn_hidden, seq_len, kv_groups; /* 0: not given */
    char ignored[512];                  /* the keys read as not about memory or time */
};

/* Reads `text` (Megatron-LM: its arguments; NeMo: key=value overrides or a YAML file's path;
 * FlagScale: a YAML file's path; ColossalAI: its plugin's keywords, key=value separated by
 * commas or spaces) for `framework` ("megatron", "nemo", "colossalai", "flagscale"). ERR_INPUT
 * naming the key and value it cannot read. */
int check_read(const char *framework, const char *text, struct check_config *out,
               struct err *e);

#endif
