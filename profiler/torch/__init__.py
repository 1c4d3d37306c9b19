"""Profiles a PyTorch model's pipeline layers as ballast-profile/1 (python3 -m profiler.torch).

Each layer runs forward and backward on its own (its input detached), on CPU or CUDA:
  fwd_ms, bwd_ms      the median of --repeat timed runs after one warm-up;
  act_bytes           what autograd saves for backward (saved_tensors_hooks), each storage
                      once, parameters excluded (they are state);
  ckpt_bytes          the layer's input (what recomputing the whole layer keeps);
  out_bytes           its output (what crosses to the next stage);
  param/grad/optimizer_bytes  the parameters, their gradients, AdamW's two fp32 moments;
  recompute_options   "attn": what the attention core (a submodule named core_attn,
                      attn_core or attention_core) makes and autograd saves, its inputs and
                      output kept; "mlp": the MLP activation's (a submodule named act, act_fn
                      or activation) output and what it saves, its input kept; "attn+mlp"
                      both; recompute_ms is that submodule's forward time.
"""
import json
import statistics
import time

import torch

ATTN_CORE = ("core_attn", "attn_core", "attention_core")
MLP_ACT = ("act", "act_fn", "activation")


def _untyped(t):
    """The tensor's storage (untyped_storage() from PyTorch 2.0, storage() before)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _storage(t):
    return (_untyped(t).data_ptr(), t.device.type)


def _storage_bytes(t):
    s = _untyped(t)
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _timed_backward(forward, grad, device, repeat):
    """The median time of the backward alone, each after an untimed forward."""
    times = []
    for i in range(repeat + 1):
        out = forward()
        _sync(device)
        start = time.perf_counter()
        out.backward(grad)
        _sync(device)
        if i:  # the first is a warm-up
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


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


class _Regions:
    """Forward hooks on the recognised submodules: which saved storages each made."""

    def __init__(self, module, params):
        self.active = []  # (kind, set of input storages) of the regions being run
        self.made = {"attn": set(), "mlp": set()}
        self.ms = {"attn": 0.0, "mlp": 0.0}
        self.found = set()
        self.params = params
        self.handles = []
        for name, sub in module.named_modules():
            last = name.rsplit(".", 1)[-1]
            kind = "attn" if last in ATTN_CORE else "mlp" if last in MLP_ACT else None
            if kind is None:
                continue
            self.found.add(kind)
            self.handles.append(sub.register_forward_pre_hook(self._enter(kind)))
            self.handles.append(sub.register_forward_hook(self._leave(kind)))

    def _enter(self, kind):
        def hook(_mod, args):
            ins = {_storage(a) for a in args if torch.is_tensor(a)}
            self.active.append((kind, ins, set(), time.perf_counter()))
        return hook

    def _leave(self, kind):
        def hook(_mod, _args, out):
            k, ins, packed, start = self.active.pop()
            outs = {_storage(o) for o in (out if isinstance(out, tuple) else (out,))
                    if torch.is_tensor(o)}
            # the attention core's output stays (what follows saves it); the activation's
            # output is what recomputing it regenerates
            self.made[k] |= packed - ins - (outs if k == "attn" else set())
            if k == "mlp":
                self.made[k] |= outs
            self.ms[k] += (time.perf_counter() - start) * 1e3
        return hook

    def packed(self, t):
        for _k, _ins, packed, _start in self.active:
            packed.add(_storage(t))

    def close(self):
        for h in self.handles:
            h.remove()


def _saved(forward, params, regions):
    """Runs forward() once under saved_tensors_hooks: {storage: bytes} saved, output."""
    saved = {}

    def pack(t):
        key = _storage(t)
        if key not in params:
            saved[key] = _storage_bytes(t)
            if regions is not None:
                regions.packed(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return saved, out


def _tensor_bytes(t):
    return t.numel() * t.element_size()


def profile_layer(name, module, x, device, repeat, loss_target=None):
    """One layer's costs; x its input (detached here); loss_target: the head's targets (the
    layer's output is logits and the loss is part of it)."""
    params = {_storage(p) for p in module.parameters()}
    x = x.detach()
    if x.is_floating_point():
        x.requires_grad_(True)

    def forward():
        out = module(x)
        if loss_target is not None:
            out = torch.nn.functional.cross_entropy(out.flatten(0, -2).float(),
                                                    loss_target.flatten())
        return out

    regions = _Regions(module, params)
    saved, out = _saved(forward, params, regions)
    regions.close()
    fwd_ms = _timed(lambda: forward(), device, repeat)
    grad = torch.ones_like(out) if loss_target is None else None

    bwd_ms = _timed_backward(forward, grad, device, repeat)
    workspace = _workspace(forward, grad, device, sum(saved.values()), module)
    module.zero_grad(set_to_none=True)
    act = sum(saved.values())
    param_bytes = sum(_tensor_bytes(p) for p in module.parameters())
    grad_bytes = sum(_tensor_bytes(p) for p in module.parameters() if p.requires_grad)
    optimizer_bytes = 2 * 4 * sum(p.numel() for p in module.parameters() if p.requires_grad)
    layer = {
        "name": name,
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        "state_bytes": param_bytes + grad_bytes + optimizer_bytes,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": optimizer_bytes,
        "act_bytes": act,
        "ckpt_bytes": _tensor_bytes(x),
        "out_bytes": _tensor_bytes(out) if loss_target is None else 0,
        "workspace_bytes": workspace,
    }
    options = []
    parts = {k: sum(saved[s] for s in regions.made[k] if s in saved) for k in regions.found}
    for k in ("attn", "mlp"):
        if parts.get(k, 0) > 0:
            options.append({"name": k, "kept_bytes": act - parts[k], "transient_bytes": parts[k],
                            "recompute_ms": regions.ms[k]})
    if len(options) == 2:
        both = parts["attn"] + parts["mlp"]
        options.append({"name": "attn+mlp", "kept_bytes": act - both, "transient_bytes": both,
                        "recompute_ms": regions.ms["attn"] + regions.ms["mlp"]})
    if options:
        layer["recompute_options"] = options
    return layer, out.detach() if loss_target is None else None


def _count(module):
    return sum(p.numel() for p in module.parameters())


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
    if len(heads) != 1 or any(_count(blk) != 12 * C * C + 13 * C for _, blk in layers[1:-1]):
        return None
    if _count(layers[-1][1]) != 2 * C + V * C:
        return None
    dtypes = {p.dtype for _, m in layers for p in m.parameters()}
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtypes.pop()) \
        if len(dtypes) == 1 else None
    if dtype is None:
        return None
    return {"kind": "gpt", "n_layer": n_layer, "n_embd": C, "n_head": heads.pop(),
            "seq_len": T, "vocab_size": V, "micro_batch": B, "dtype": dtype}


def profile(layers, tokens, targets, device, repeat=3, name="custom", memory_bytes=None):
    """layers: [(name, module)] in pipeline order, the last producing logits; tokens: the
    first layer's input; targets: the loss's. The model is kind gpt when the layers are
    Ballast's GPT (recognise_gpt), else {"kind": "custom", "name": name}."""
    model = recognise_gpt(layers, tokens) or {"kind": "custom", "name": name}
    device = torch.device(device)
    x = tokens.to(device)
    out_layers = []
    for i, (name, module) in enumerate(layers):
        module.to(device).train()
        last = i == len(layers) - 1
        layer, x = profile_layer(name, module, x, device, repeat,
                                 targets.to(device) if last else None)
        out_layers.append(layer)
    if memory_bytes is None:
        if device.type == "cuda":
            memory_bytes = torch.cuda.get_device_properties(device).total_memory
        else:
            import os
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "format": "ballast-profile/1",
        "device": {"name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "kind": device.type, "memory_bytes": memory_bytes},
        "estimated": False,
        "model": model,
        "provenance": {"method": "profiler.torch: PyTorch %s, saved_tensors_hooks for the saved "
                                 "tensors, median of %d runs; workspace_bytes from CUDA's "
                                 "peak allocation (0 on CPU, where it is not measured)"
                                 % (torch.__version__, repeat)},
        "layers": out_layers,
    }


def write(prof, path):
    with open(path, "w") as f:
        json.dump(prof, f, indent=1)
        f.write("\n")
