"""Hugging Face transformers models for profiler.torch: built from a config with random weights
(nothing downloaded), split into Ballast's planning layers (embed, block.0 ..., head) that run
as the model's own forward runs them, and recognised as Ballast's kind gpt or llama where
Ballast's model is the same computation.

Families: GPT-2 (model_type gpt2: wte + wpe + dropout, GPT2Block, ln_f + lm_head) and the Llama
family (llama, mistral, qwen2: embed_tokens, decoder layers given the model's causal mask,
positions and rotary cos/sin, norm + lm_head). Written against the transformers release pinned in
profiler/torch/requirements.txt (4.46), whose module names the split uses; 5 names them the same,
returns a block's hidden states alone and makes causal masks with masking_utils, which
_hidden and _causal_mask follow."""
import inspect
import json
import os
import sys

import torch
from torch import nn

from . import DTYPES, dtype_name, gpt_block_params
from .errors import ProfileError

os.environ["HF_HUB_OFFLINE"] = "1"  # a config is all it needs: never download

FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama"}
KNOWN = ", ".join(sorted(FAMILIES))


def transformers_module():
    try:
        import transformers
    except ImportError:
        raise ProfileError("the transformers package is not installed for %s; scripts/deps.sh "
                           "installs it (profiler/torch/requirements.txt)"
                           % sys.executable) from None
    transformers.logging.set_verbosity_error()
    return transformers


def _read_config_file(spec):
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as exc:
        raise ProfileError("--hf %s: %s" % (path, exc.strerror)) from None
    except ValueError as exc:
        raise ProfileError("--hf %s: not JSON: %s" % (path, exc)) from None
    if not isinstance(d, dict):
        raise ProfileError("--hf %s: expected a JSON object (a config.json)" % path)
    if d.get("model_type") not in FAMILIES:
        raise ProfileError("--hf %s: model_type: %s, expected one of %s"
                           % (path, json.dumps(d.get("model_type")), KNOWN))
    return path, d


def _fields(defaults, overrides):
    """--set KEY=VALUE as a dict: VALUE as JSON, else the bare string; KEY one of the fields of
    `defaults` (the model type's default config)."""
    fields = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ProfileError("--set %s: expected KEY=VALUE" % item)
        known = defaults.to_dict()
        if key not in known and key not in defaults.attribute_map and \
                key not in (known.get("rope_parameters") or {}):  # rope_theta in 5
            raise ProfileError("--set %s: %s has no field %s"
                               % (item, type(defaults).__name__, key))
        try:
            fields[key] = json.loads(text)
        except ValueError:
            fields[key] = text
    return fields


def load_config(spec, overrides=()):
    """spec: a model type (transformers' default sizes for it) or a config.json, or a folder
    holding one; overrides: ["KEY=VALUE"]. The config is made with them, so that the fields
    derived from others (head_dim from hidden_size) follow."""
    tf = transformers_module()
    if spec in FAMILIES:
        path, d = spec, {"model_type": spec}
    elif os.path.exists(spec) or spec.endswith(".json"):
        path, d = _read_config_file(spec)
    else:
        raise ProfileError("--hf %s: neither a model type (%s) nor a config.json" % (spec, KNOWN))
    d.update(_fields(tf.AutoConfig.for_model(d["model_type"]), overrides))
    try:
        return tf.AutoConfig.for_model(**d)
    except Exception as exc:  # the config class's own checks
        raise ProfileError("--hf %s: %s" % (path, exc)) from None


def build(config, dtype="fp32", seed=0):
    """The causal LM of `config`, random weights from `seed`, its parameters in `dtype`."""
    tf = transformers_module()
    torch.manual_seed(seed)
    try:
        return tf.AutoModelForCausalLM.from_config(config, torch_dtype=DTYPES[dtype])
    except Exception as exc:  # sizes the model's own constructor refuses
        raise ProfileError("--hf: building %s: %s" % (config.model_type, exc)) from None


class _Gpt2Embed(nn.Module):
    """GPT2Model's forward up to its blocks: token and position embeddings, dropout."""

    def __init__(self, transformer):
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[-1], device=tokens.device).unsqueeze(0)
        return self.drop(self.wte(tokens) + self.wpe(positions))


def _hidden(out):
    """A block's output: its hidden states (transformers 5 returns them alone, 4 a tuple)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _causal_mask(backbone):
    """The causal mask as the backbone's forward makes it without padding or cache: where the
    model's module calls masking_utils' create_causal_mask (transformers 5, and Llama from
    4.53), that; else its own _update_causal_mask (Llama's before); else none (GPT-2 in 4: the
    mask is the attention's buffer). Their arguments differ between releases: each takes what
    its signature names."""
    create = getattr(sys.modules.get(type(backbone).__module__), "create_causal_mask", None)
    update = getattr(backbone, "_update_causal_mask", None)
    make = create or update
    if make is None:
        return lambda x, cache_position: None
    accepted = inspect.signature(make).parameters

    def mask(x, cache_position):
        args = {"config": backbone.config, "input_embeds": x, "inputs_embeds": x,
                "input_tensor": x, "attention_mask": None, "cache_position": cache_position,
                "past_key_values": None, "position_ids": cache_position.unsqueeze(0),
                "use_cache": False, "output_attentions": False}
        return make(**{k: v for k, v in args.items() if k in accepted})
    return mask


class _Gpt2Block(nn.Module):
    """A GPT2Block as GPT2Model calls it in training without padding: its causal mask, no
    cache."""

    def __init__(self, block, backbone):
        super().__init__()
        self.block = block
        self.mask = _causal_mask(backbone)

    def forward(self, x):
        cache_position = torch.arange(x.shape[1], device=x.device)
        return _hidden(self.block(x, attention_mask=self.mask(x, cache_position),
                                  use_cache=False))


class _DecoderBlock(nn.Module):
    """A Llama-family decoder layer as its model's forward calls it: positions 0..T-1, the
    model's causal mask, and the rotary cos/sin where the model computes them once for every
    layer (its rotary_emb; where the layers compute their own, they do so here too)."""

    def __init__(self, layer, backbone):
        super().__init__()
        self.layer = layer
        self.rotary = getattr(backbone, "rotary_emb", None)
        self.mask = _causal_mask(backbone)
        self.takes_cache_position = "cache_position" in inspect.signature(
            layer.forward).parameters

    def forward(self, x):
        cache_position = torch.arange(x.shape[1], device=x.device)
        position_ids = cache_position.unsqueeze(0)
        kwargs = {"attention_mask": self.mask(x, cache_position), "position_ids": position_ids,
                  "use_cache": False}
        if self.takes_cache_position:
            kwargs["cache_position"] = cache_position
        if self.rotary is not None:
            kwargs["position_embeddings"] = self.rotary(x, position_ids)
        return _hidden(self.layer(x, **kwargs))


class _Head(nn.Module):
    """The final norm and the output projection (the loss is profiler.torch's own)."""

    def __init__(self, norm, lm_head):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x):
        return self.lm_head(self.norm(x))


def split(model):
    """[(name, module)]: embed, block.0 ..., head."""
    family = FAMILIES.get(getattr(model.config, "model_type", None))
    if family is None or model.get_output_embeddings() is None:
        raise ProfileError("%s (model_type %s): profiler.torch splits the causal LMs of %s"
                           % (type(model).__name__, model.config.model_type, KNOWN))
    if family == "gpt2":
        t = model.transformer
        blocks = [_Gpt2Block(b, t) for b in t.h]
        first, last = _Gpt2Embed(t), _Head(t.ln_f, model.lm_head)
    else:
        m = model.model
        blocks = [_DecoderBlock(layer, m) for layer in m.layers]
        first, last = m.embed_tokens, _Head(m.norm, model.lm_head)
    return [("embed", first)] + [("block.%d" % i, b) for i, b in enumerate(blocks)] + \
        [("head", last)]


def _count(module):
    return sum(p.numel() for p in module.parameters())


def _counts_differ(layers, embed, block, head):
    """Why the layers' parameter counts are not Ballast's, or None."""
    want = [embed] + [block] * (len(layers) - 2) + [head]
    for (name, module), n in zip(layers, want):
        if _count(module) != n:
            return "%s has %d parameters, Ballast's %d" % (name, _count(module), n)
    return None


def _gpt2_fields(c, layers, B, T):
    C, V, P = c.n_embd, c.vocab_size, c.n_positions
    checks = [(c.n_inner not in (None, 4 * C), "n_inner %s, not 4 n_embd" % c.n_inner),
              (not c.activation_function.startswith("gelu"),
               "activation_function %s, not a GELU" % c.activation_function),
              (c.add_cross_attention, "add_cross_attention"),
              (not c.scale_attn_weights, "scale_attn_weights false"),
              (c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx"),
              (c.reorder_and_upcast_attn, "reorder_and_upcast_attn")]
    why = next((w for bad, w in checks if bad), None) or \
        _counts_differ(layers, V * C + P * C, gpt_block_params(C), 2 * C + V * C)
    return why, {"kind": "gpt", "n_layer": c.n_layer, "n_embd": C, "n_head": c.n_head,
                 "seq_len": T, "vocab_size": V, "micro_batch": B}


def llama_block_params(C, H, KV, F):
    """Ballast's Llama block: q and o (C x C), k and v (C x C KV/H), gate, up and down (C x F),
    two RMSNorm weights; no biases."""
    return 2 * C * C + 2 * C * (C * KV // H) + 3 * C * F + 2 * C


def _rope(c):
    """(rope_theta, the scaling or None): transformers 4's rope_theta and rope_scaling, or 5's
    rope_parameters {"rope_type", "rope_theta", ...}, whose type "default" is no scaling."""
    p = getattr(c, "rope_parameters", None)
    if isinstance(p, dict) and "rope_theta" in p:
        return p["rope_theta"], p if p.get("rope_type", "default") != "default" else None
    return c.rope_theta, getattr(c, "rope_scaling", None)


def _llama_fields(c, layers, B, T):
    C, H, V, F = c.hidden_size, c.num_attention_heads, c.vocab_size, c.intermediate_size
    KV = c.num_key_value_heads or H
    theta, rope = _rope(c)
    biases = [n for n, _ in layers[1][1].layer.named_parameters() if n.endswith("bias")]
    window = getattr(c, "sliding_window", None) \
        if getattr(c, "use_sliding_window", True) else None
    checks = [(biases, "biases in its blocks (%s)" % ", ".join(biases[:3])),
              (c.hidden_act != "silu", "hidden_act %s, not silu" % c.hidden_act),
              (getattr(c, "head_dim", None) not in (None, C // H),
               "head_dim %s, not hidden_size / num_attention_heads" % getattr(c, "head_dim", 0)),
              (rope, "rope_scaling %s (Ballast's llama has rope_theta only)" % json.dumps(rope)),
              (getattr(c, "pretraining_tp", 1) != 1, "pretraining_tp %s" % getattr(
                  c, "pretraining_tp", 1)),
              (window is not None and window < T,
               "sliding_window %s, shorter than --seq-len %d" % (window, T))]
    why = next((w for bad, w in checks if bad), None) or \
        _counts_differ(layers, V * C, llama_block_params(C, H, KV, F), C + V * C)
    return why, {"kind": "llama", "n_layer": c.num_hidden_layers, "n_embd": C, "n_head": H,
                 "n_kv_head": KV, "ffn_hidden": F, "rope_theta": theta,
                 "norm_eps": c.rms_norm_eps, "seq_len": T, "vocab_size": V, "micro_batch": B}


def recognise(model, layers, B, T):
    """(Ballast's model fields, None) when Ballast's kind gpt or llama is the same computation,
    else (None, why not)."""
    c = model.config
    if len(layers) < 3:
        return None, "no blocks"
    fields = _gpt2_fields if FAMILIES[c.model_type] == "gpt2" else _llama_fields
    why, model_fields = fields(c, layers, B, T)
    dtype = dtype_name(layers)
    if why is None and dtype is None:
        why = "its parameters are not all of one of %s" % ", ".join(DTYPES)
    if why is not None:
        return None, why
    model_fields["dtype"] = dtype
    return model_fields, None


def check_seq_len(config, seq_len):
    """GPT-2's position table has n_positions rows: a longer sequence cannot run."""
    positions = getattr(config, "n_positions", None)
    if positions is not None and seq_len > positions:
        raise ProfileError("--seq-len %d: more than %s's n_positions %d"
                           % (seq_len, config.model_type, positions))


def prepare(model, micro_batch, seq_len, name=None, seed=0):
    """What profile() takes for a transformers causal LM: layers, tokens and targets (random
    token ids), the model fields (kind gpt or llama, else custom named `name` or the model
    type), why it is custom (or None), and the provenance's source."""
    c = model.config
    check_seq_len(c, seq_len)
    layers = split(model)
    fields, why = recognise(model, layers, micro_batch, seq_len)
    if fields is None:
        fields = {"kind": "custom", "name": name or getattr(c, "name_or_path", "") or c.model_type}
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(c.vocab_size, (micro_batch, seq_len), generator=g)
    targets = torch.randint(c.vocab_size, (micro_batch, seq_len), generator=g)
    tf = transformers_module()
    source = {"transformers": {"version": tf.__version__, "model_type": c.model_type,
                               "class": type(model).__name__,
                               "attn_implementation": c._attn_implementation}}
    return {"layers": layers, "tokens": tokens, "targets": targets, "model": fields,
            "custom_why": why, "source": source}
