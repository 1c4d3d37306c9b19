/* Weights in and out as safetensors (the format Hugging Face and PyTorch tools read):
 *
 *   8 bytes   N, the header's length, little-endian uint64
 *   N bytes   JSON: {"__metadata__": {...}, NAME: {"dtype": "F32"|"BF16"|"F16", "shape": [...],
 *             "data_offsets": [BEGIN, END]}, ...}, padded with spaces to a multiple of 8
 *   the rest  the tensors' bytes, little-endian, row-major, at 8 + N + BEGIN
 *
 * The GPT's parameters take Hugging Face's GPT-2 names (GPT2LMHeadModel less its
 * "transformer." prefix): wte.weight, wpe.weight, h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight,
 * ..., ln_f.weight, and lm_head.weight (Ballast's output projection is its own; a file without
 * it, as Hugging Face's GPT-2 ties it to wte, takes wte.weight's values). Hugging Face keeps
 * c_attn, c_proj and c_fc as Conv1D, [in, out]; Ballast as (out, in) (models/sizes.c): those
 * are transposed on the way in and out. An fp32 model's file holds F32, a bf16 model's BF16
 * and an fp16 model's F16 (the weights it computes with); any loads into any (16-bit values
 * widened exactly, F32 rounded to nearest even for a 16-bit model's compute copy; master
 * weights keep the file's values). A file holding a NaN or an infinity is refused on the way
 * in (naming the tensor and the element) and never written on the way out.
 *
 * A Llama takes LlamaForCausalLM's names: model.embed_tokens.weight,
 * model.layers.{i}.input_layernorm.weight, .self_attn.{q,k,v,o}_proj.weight,
 * .post_attention_layernorm.weight, .mlp.{gate,up,down}_proj.weight, model.norm.weight,
 * lm_head.weight (missing: model.embed_tokens.weight's values, a tied model). All are
 * (out, in) as Ballast keeps them; Ballast's fused qkv_w and fc_w are q, k, v and gate, up
 * stacked by rows, so each row block is its own tensor in the file. Hugging Face's q_proj and
 * k_proj rotate pairs (i, i + head_size/2), as Ballast's rotary kernels do. */
#ifndef BALLAST_SAFETENSORS_H
#define BALLAST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "stage.h"

#define ST_NAME_MAX 64
/* The longest header read (Hugging Face's safetensors reader refuses longer ones): a longer
 * one is refused before anything is allocated for it. */
#define ST_HEADER_MAX 100000000
/* In a file name: the stage's index (each rank its own file); without it, one file. */
#define ST_STAGE_MARK "{stage}"

enum st_dtype { ST_F32, ST_BF16, ST_F16 };

/* One tensor's description; its bytes lie at `offset` of a blob the caller holds. */
struct st_tensor {
    char name[ST_NAME_MAX];
    int dtype; /* enum st_dtype */
    int ndim;
    int64_t shape[2];
    int64_t offset, bytes;
};

/* This stage's parameters as named tensors in Hugging Face's layout: *t and *blob are
 * allocated (caller frees), the tensors' bytes back to back in *blob. */
int st_stage_collect(struct stage_runner *r, struct st_tensor **t, int *n, char **blob,
                     struct err *e);

/* Writes tensors t[i], whose bytes are at blobs[i] + t[i].offset, to `file` (through a
 * temporary, renamed when complete). */
int st_write(const char *file, const struct st_tensor *t, int n, char *const *blobs,
             struct err *e);

/* Sets this stage's weights from `file` (only its own layers' tensors are read; others in the
 * file are ignored): ERR_INPUT naming the file and the field when the header's length is over
 * ST_HEADER_MAX or runs past the file, the header is not safetensors JSON, a tensor's bytes lie past the end
 * (truncated), one is missing, or its dtype or shape is not what this model needs. */
int st_stage_load(struct stage_runner *r, const char *file, struct err *e);

/* `pattern` with ST_STAGE_MARK replaced by `stage` (or as is). */
void st_stage_path(const char *pattern, int stage, char *out, size_t size);

#endif
