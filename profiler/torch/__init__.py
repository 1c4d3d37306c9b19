"""Profiles a PyTorch model's pipeline layers as ballast-profile/1 (python3 -m profiler.torch).

Each layer runs forward and backward on its own (its input detached), on CPU or CUDA:
  fwd_ms, bwd_ms      medians of timed runs (timing.py says how many; the provenance gives
                      each span's runs and spread);
  act_bytes           what autograd saves for backward (saved_tensors_hooks), each storage
                      once, the layer's parameters and registered buffers excluded (state, and
                      constants such as GPT-2's causal mask);
  ckpt_bytes          the layer's input (what recomputing the whole layer keeps);
  out_bytes           its output (what crosses to the next stage);
  param_bytes         the parameters as stored; grad_bytes and optimizer_bytes as training
                      keeps them: in fp32 the gradients and AdamW's two moments; with 2-byte
                      weights (bf16, fp16: mixed precision as Ballast's runtime and Megatron-LM
                      keep it) fp32 gradients and fp32 master weights, m and v;
  recompute_options   "attn": what the attention core makes and autograd saves, its inputs and
                      output kept: a submodule named core_attn, attn_core or attention_core, or
                      a method named _attn (Hugging Face GPT-2's); "mlp": the MLP activation's
                      (a submodule named act, act_fn or activation) output and what it saves,
                      its input kept; "attn+mlp" both; recompute_ms is the region's forward.
"""
import os
import statistics
import time

import torch

from . import timing
from .errors import FAIL, ProfileError

ATTN_CORE = ("core_attn", "attn_core", "attention_core")
ATTN_CORE_METHODS = ("_attn",)
MLP_ACT = ("act", "act_fn", "activation")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HALF = (torch.bfloat16, torch.float16)


def _untyped(t):
    """The tensor's storage (untyped_storage() from PyTorch 2.0, storage() before)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _storage(t):
    return (_untyped(t).data_ptr(), t.device.type)


def _storage_bytes(t):
    s = _untyped(t)
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def _tensor_bytes(t):
    return t.numel() * t.element_size()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_tensor(out):
    """A module's output, or the first tensor of a tuple (GPT-2's _attn returns the output
    and the probabilities)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def state_storages(module):
    """The storages of a layer's parameters and registered buffers: not activations."""
    return {_storage(t) for t in list(module.parameters()) + list(module.buffers())}


class _Regions:
    """The layer's recompute regions (the module docstring's "attn" and "mlp"), hooked while
    it exists: which saved storages each makes, and how long each runs (synchronised)."""

    def __init__(self, module, device):
        self.device = device
        self.active = []  # per region being run: kind, input storages, storages saved meanwhile
        self.made = {"attn": set(), "mlp": set()}
        self.ms = {"attn": 0.0, "mlp": 0.0}
        self.found = set()
        self.handles, self.patched = [], []
        for name, sub in module.named_modules():
            last = name.rsplit(".", 1)[-1]
            kind = "attn" if last in ATTN_CORE else "mlp" if last in MLP_ACT else None
            if kind is not None:
                self.found.add(kind)
                self.handles.append(sub.register_forward_pre_hook(
                    lambda _m, args, k=kind: self._enter(k, args)))
                self.handles.append(sub.register_forward_hook(
                    lambda _m, _args, out: self._leave(out)))
            for meth in ATTN_CORE_METHODS:
                if callable(getattr(type(sub), meth, None)):
                    self.found.add("attn")
                    setattr(sub, meth, self._wrap("attn", getattr(sub, meth)))
                    self.patched.append((sub, meth))

    def _wrap(self, kind, fn):
        def region(*args, **kwargs):
            self._enter(kind, args)
            out = fn(*args, **kwargs)
            self._leave(out)
            return out
        return region

    def _enter(self, kind, args):
        _sync(self.device)
        ins = {_storage(a) for a in args if torch.is_tensor(a)}
        self.active.append((kind, ins, set(), time.perf_counter()))

    def _leave(self, out):
        _sync(self.device)
        kind, ins, packed, start = self.active.pop()
        out = _first_tensor(out)
        outs = {_storage(out)} if torch.is_tensor(out) else set()
        # the attention core's output stays (what follows saves it); the activation's output
        # is what recomputing it regenerates
        self.made[kind] |= packed - ins - (outs if kind == "attn" else set())
        if kind == "mlp":
            self.made[kind] |= outs
        self.ms[kind] += (time.perf_counter() - start) * 1e3

    def packed(self, t):
        for _kind, _ins, packed, _start in self.active:
            packed.add(_storage(t))

    def parts(self, saved):
        """{kind: bytes of the saved storages the region makes}, regions that make some."""
        parts = {k: sum(saved[s] for s in self.made[k] if s in saved) for k in self.found}
        return {k: v for k, v in parts.items() if v > 0}

    def times(self, forward, repeat):
        """{kind: median ms} over timed forwards."""
        per_kind = {k: [] for k in self.found}

        def once():
            self.ms = dict.fromkeys(self.ms, 0.0)
            forward()
            for k, v in per_kind.items():
                v.append(self.ms[k])
            return sum(self.ms.values())

        runs = timing.measure(once, repeat).runs
        return {k: statistics.median(v[-runs:]) for k, v in per_kind.items()}

    def close(self):
        for h in self.handles:
            h.remove()
        for sub, meth in self.patched:
            delattr(sub, meth)


def _saved(forward, state, regions):
    """Runs forward() once under saved_tensors_hooks: {storage: bytes} saved, output."""
    saved = {}

    def pack(t):
        key = _storage(t)
        if key not in state:
            saved[key] = _storage_bytes(t)
            regions.packed(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return saved, out


def _forward_once(forward, device):
    _sync(device)
    start = time.perf_counter()
    forward()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def _backward_once(forward, grad, device):
    """The backward alone, after an untimed forward."""
    out = forward()
    _sync(device)
    start = time.perf_counter()
    out.backward(grad)
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def _workspace(forward, grad, device, act, module):
    """CUDA: the peak of one forward and backward above what stays (the saved tensors, the
    gradients, the output); the CPU allocator keeps no peak, so 0 there."""
    if device.type != "cuda":
        return 0
    module.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = forward()
    out.backward(grad)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    grads = sum(_tensor_bytes(p.grad) for p in module.parameters() if p.grad is not None)
    return max(0, peak - act - grads - _tensor_bytes(out))


def _state_split(module):
    """param_bytes, grad_bytes, optimizer_bytes as the module docstring says."""
    param = grad = optimizer = 0
    for p in module.parameters():
        param += _tensor_bytes(p)
        if p.requires_grad:
            wide = 4 if p.dtype in HALF else p.element_size()
            grad += wide * p.numel()
            optimizer += (3 if p.dtype in HALF else 2) * wide * p.numel()
    return param, grad, optimizer


def _options(act, parts, region_ms):
    options = [{"name": k, "kept_bytes": act - parts[k], "transient_bytes": parts[k],
                "recompute_ms": region_ms[k]} for k in ("attn", "mlp") if k in parts]
    if len(options) == 2:
        both = parts["attn"] + parts["mlp"]
        options.append({"name": "attn+mlp", "kept_bytes": act - both, "transient_bytes": both,
                        "recompute_ms": region_ms["attn"] + region_ms["mlp"]})
    return options


def _forward_fn(module, x, loss_target):
    def forward():
        out = module(x)
        if loss_target is not None:
            out = torch.nn.functional.cross_entropy(out.flatten(0, -2).float(),
                                                    loss_target.flatten())
        return out
    return forward


def _saved_once(module, forward, device):
    """One forward under the hooks: {storage: bytes} saved, {region: bytes it makes}, the
    output (detached)."""
    regions = _Regions(module, device)
    try:
        saved, out = _saved(forward, state_storages(module), regions)
    finally:
        regions.close()
    return saved, regions.parts(saved), out.detach()


def _region_times(module, forward, device, repeat):
    regions = _Regions(module, device)
    try:
        return regions.times(forward, repeat)
    finally:
        regions.close()


def profile_layer(name, module, x, device, repeat, loss_target=None):
    """One layer's costs, its output (None for the head) and its spans' timing statistics;
    x its input (detached here); loss_target: the head's targets (the layer's output is
    logits and the loss is part of it); repeat: timed runs, None for timing.py's policy."""
    x = x.detach()
    if x.is_floating_point():
        x.requires_grad_(True)
    forward = _forward_fn(module, x, loss_target)
    saved, parts, out = _saved_once(module, forward, device)
    grad = torch.ones_like(out) if loss_target is None else None
    fwd = timing.measure(lambda: _forward_once(forward, device), repeat)
    bwd = timing.measure(lambda: _backward_once(forward, grad, device), repeat)
    region_ms = _region_times(module, forward, device, repeat) if parts else {}
    act = sum(saved.values())
    workspace = _workspace(forward, grad, device, act, module)
    module.zero_grad(set_to_none=True)
    param_bytes, grad_bytes, optimizer_bytes = _state_split(module)
    layer = {"name": name, "fwd_ms": fwd.median_ms, "bwd_ms": bwd.median_ms,
             "state_bytes": param_bytes + grad_bytes + optimizer_bytes,
             "param_bytes": param_bytes, "grad_bytes": grad_bytes,
             "optimizer_bytes": optimizer_bytes, "act_bytes": act,
             "ckpt_bytes": _tensor_bytes(x),
             "out_bytes": _tensor_bytes(out) if loss_target is None else 0,
             "workspace_bytes": workspace}
    options = _options(act, parts, region_ms)
    if options:
        layer["recompute_options"] = options
    spans = {"layer": name, "fwd": fwd.as_json(), "bwd": bwd.as_json()}
    return layer, (out if loss_target is None else None), spans


def _count(module):
    return sum(p.numel() for p in module.parameters())


def gpt_block_params(C):
    """Ballast's GPT block: qkv and projection, the MLP (4 C wide), two LayerNorms."""
    return 12 * C * C + 13 * C


def dtype_name(layers):
    """"fp32", "bf16" or "fp16" when every parameter has that dtype, else None."""
    dtypes = {p.dtype for _, m in layers for p in m.parameters()}
    names = {v: k for k, v in DTYPES.items()}
    return names.get(dtypes.pop()) if len(dtypes) == 1 else None


def recognise_gpt(layers, tokens):
    """Ballast's GPT fields when the layers are its GPT (embed with (V, C) and (T, C) tables,
    n blocks of 12 C^2 + 13 C parameters with an n_head attribute somewhere, a head of
    2 C + V C), else None."""
    names = [n for n, _ in layers]
    n_layer = len(layers) - 2
    if n_layer < 1 or names != ["embed"] + ["block.%d" % i for i in range(n_layer)] + ["head"]:
        return None
    B, T = tokens.shape
    shapes = sorted(tuple(p.shape) for p in layers[0][1].parameters())
    if len(shapes) != 2 or any(len(sh) != 2 for sh in shapes) or shapes[0][1] != shapes[1][1]:
        return None
    C = shapes[0][1]
    tables = [sh[0] for sh in shapes]
    if T not in tables:
        return None
    tables.remove(T)
    V = tables[0]
    heads = {getattr(m, "n_head") for _, blk in layers[1:-1] for m in blk.modules()
             if isinstance(getattr(m, "n_head", None), int)}
    if len(heads) != 1 or any(_count(blk) != gpt_block_params(C) for _, blk in layers[1:-1]):
        return None
    if _count(layers[-1][1]) != 2 * C + V * C:
        return None
    dtype = dtype_name(layers)
    if dtype is None:
        return None
    return {"kind": "gpt", "n_layer": n_layer, "n_embd": C, "n_head": heads.pop(),
            "seq_len": T, "vocab_size": V, "micro_batch": B, "dtype": dtype}


def parse_device(spec):
    """A torch.device for --device (cpu, cuda or cuda:N), checked against this machine."""
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        raise ProfileError("--device %s: %s" % (spec, exc)) from None
    if device.type not in ("cpu", "cuda"):
        raise ProfileError("--device %s: expected cpu, cuda or cuda:N" % spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ProfileError("--device %s: PyTorch sees no CUDA device here" % spec)
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ProfileError("--device %s: this machine has %d CUDA device(s)"
                               % (spec, torch.cuda.device_count()))
        device = torch.device("cuda", index)
    return device


def check_dtype(device, dtype):
    """Refuses a dtype the device cannot compute in before anything runs (PyTorch 1.13 has no
    fp16 matmul, softmax or norms on CPU)."""
    a = torch.ones(2, 2, dtype=DTYPES[dtype], device=device)
    try:
        torch.softmax(a @ a, -1)
    except RuntimeError as exc:
        raise ProfileError("--dtype %s: PyTorch %s cannot compute in %s on %s (%s); measure it "
                           "on a CUDA device (--device cuda:N)"
                           % (dtype, torch.__version__, dtype, device.type,
                              str(exc).splitlines()[0])) from None


def _memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _profile_layers(layers, tokens, targets, device, repeat, progress):
    x = tokens.to(device)
    out_layers, spans = [], []
    for i, (name, module) in enumerate(layers):
        last = i == len(layers) - 1
        try:
            module.to(device).train()
            layer, x, span = profile_layer(name, module, x, device, repeat,
                                           targets.to(device) if last else None)
        except Exception as exc:  # the user's model failed: one line, not a traceback
            what = "out of memory" if "out of memory" in str(exc) else type(exc).__name__
            raise ProfileError("layer %s (%d of %d) failed on %s: %s: %s"
                               % (name, i + 1, len(layers), device, what,
                                  (str(exc).splitlines() or [""])[0]), FAIL) from None
        if device.type == "cuda":  # one layer on the device at a time
            module.to("cpu")
        out_layers.append(layer)
        spans.append(span)
        if progress is not None:
            progress(layer, span)
    return out_layers, spans


def profile(layers, tokens, targets, device, repeat=None, name="custom", memory_bytes=None,
            model=None, dtype=None, source=None, progress=None, device_name=None):
    """layers: [(name, module)] in pipeline order, the last producing logits; tokens: the
    first layer's input; targets: the loss's; repeat: timed runs per span, None for timing.py's
    policy; dtype: "fp32", "bf16" or "fp16" to cast the layers to, None to keep theirs;
    model: the profile's model fields, by default kind gpt when the layers are Ballast's GPT
    (recognise_gpt), else {"kind": "custom", "name": name}; source: added to the provenance;
    progress(layer, spans) is called after each layer; device_name: the profile's device.name
    (default the CUDA device's name, or "cpu")."""
    device = parse_device(device) if not isinstance(device, torch.device) else device
    if dtype is not None:
        check_dtype(device, dtype)
        for _, module in layers:
            module.to(DTYPES[dtype])
    model = model or recognise_gpt(layers, tokens) or {"kind": "custom", "name": name}
    out_layers, spans = _profile_layers(layers, tokens, targets, device, repeat, progress)
    provenance = {
        "method": "profiler.torch: PyTorch %s, saved_tensors_hooks for the saved tensors "
                  "(parameters and buffers excluded); each span the %s; workspace_bytes from "
                  "CUDA's peak allocation (0 on CPU, where it is not measured)"
                  % (torch.__version__, timing.describe(repeat)),
        "spans": spans,
    }
    provenance.update(source or {})
    return {
        "format": "ballast-profile/1",
        "device": {"name": device_name or (torch.cuda.get_device_name(device)
                                           if device.type == "cuda" else "cpu"),
                   "kind": device.type,
                   "memory_bytes": memory_bytes or _memory_bytes(device)},
        "estimated": False,
        "model": model,
        "provenance": provenance,
        "layers": out_layers,
    }
