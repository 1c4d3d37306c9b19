"""Ballast against the PyTorch references (bench/torch_gpt_model.py, bench/torch_llama_model.py),
on CPU, from the same weights: a safetensors file written here (Hugging Face's names: GPT-2's,
with its Conv1D layout, or LlamaForCausalLM's; by this script's own writer) is loaded by both.
The data is an llm.c token file of exactly seq_len + 1 tokens, so every row of every
micro-batch is the same sequence in both.
  - step 1: the loss, and every parameter's gradient (read from the checkpoint `--save` writes:
    its gradient section, tensors in the size tables' order at 64-byte offsets);
  - 5 AdamW steps (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and
    embeddings): every step's loss and the weights `--save-weights` writes at the end;
the steps on 1 and 2 stages (GPT) or 1 and 3 (Llama). Tolerances (fp32, different summation
orders): loss 1e-5 relative, gradients 1e-4 of the tensor's largest magnitude (+1e-7),
weights 1e-4 absolute after 5 steps (AdamW moves each weight by about lr = 1e-3 per step, so a
gradient sign error shows as 1e-3).
Needs Debian's python3-torch for /usr/bin/python3 (scripts/deps.sh installs it).
Run: /usr/bin/python3 tests/torch/test_numerics_torch.py BALLAST [WORKDIR] [--kind gpt|llama]
[--attention flash] from the repo root (default gpt; llama: configs/models/llama-tiny.json).
--attention flash runs Ballast's flash kernels ("attention": "flash") against the same
reference: PyTorch's materialised softmax is the same function, so the bounds stay."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_or_skip import require_torch  # noqa: E402

require_torch("test_numerics_torch")
import torch  # noqa: E402

from torch_gpt_model import GPT  # noqa: E402
from torch_llama_model import Llama  # noqa: E402

GPT_MODEL = {"format": "ballast-model/1", "kind": "gpt", "n_layer": 2, "n_embd": 32,
             "n_head": 2, "seq_len": 16, "vocab_size": 64, "micro_batch": 2, "dtype": "fp32"}
M = 2  # micro-batches
STEPS = 5
LR = 1e-3
LOSS_RTOL, GRAD_TOL, WEIGHT_ATOL = 1e-5, 1e-4, 1e-4
FAILS = []

# Ballast's parameter tables (models/sizes.c), in order, with the reference's names and
# Hugging Face's (Conv1D ones transposed)
EMBED = [("wte.weight", "wte.weight", 0), ("wpe.weight", "wpe.weight", 0)]
BLOCK = [("ln1.weight", "ln_1.weight", 0), ("ln1.bias", "ln_1.bias", 0),
         ("qkv.weight", "attn.c_attn.weight", 1), ("qkv.bias", "attn.c_attn.bias", 0),
         ("proj.weight", "attn.c_proj.weight", 1), ("proj.bias", "attn.c_proj.bias", 0),
         ("ln2.weight", "ln_2.weight", 0), ("ln2.bias", "ln_2.bias", 0),
         ("fc.weight", "mlp.c_fc.weight", 1), ("fc.bias", "mlp.c_fc.bias", 0),
         ("fcproj.weight", "mlp.c_proj.weight", 1), ("fcproj.bias", "mlp.c_proj.bias", 0)]
HEAD = [("lnf.weight", "ln_f.weight", 0), ("lnf.bias", "ln_f.bias", 0),
        ("lm.weight", "lm_head.weight", 0)]
# models/llama.c's tables: the reference carries Hugging Face's names; Ballast's qkv_w and
# fc_w are q, k, v and gate, up stacked by rows, one tensor each in the checkpoint
LLAMA_BLOCK = [["input_layernorm.weight"],
               ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
               ["self_attn.o_proj.weight"], ["post_attention_layernorm.weight"],
               ["mlp.gate_proj.weight", "mlp.up_proj.weight"], ["mlp.down_proj.weight"]]


def gpt_params():
    """Ballast's parameters in arena order: ([(reference name, Hugging Face name)], transposed)."""
    out = [([(r, h)], t) for r, h, t in EMBED]
    for i in range(GPT_MODEL["n_layer"]):
        out += [([("blocks.%d.%s" % (i, r), "h.%d.%s" % (i, h))], t) for r, h, t in BLOCK]
    return out + [([(r, h)], t) for r, h, t in HEAD]


def llama_params(m):
    out = [([("model.embed_tokens.weight",) * 2], 0)]
    for i in range(m["n_layer"]):
        out += [([("model.layers.%d.%s" % (i, h),) * 2 for h in hs], 0) for hs in LLAMA_BLOCK]
    return out + [([("model.norm.weight",) * 2], 0), ([("lm_head.weight",) * 2], 0)]


def kind_setup(kind, attention):
    """(model, reference model, parameters in arena order, stage counts)."""
    torch.manual_seed(0)
    if kind == "gpt":
        m = dict(GPT_MODEL)
        ref, params, stages = GPT(m, recompute=False), gpt_params(), (1, 2)
    else:
        with open(os.path.join(ROOT, "configs", "models", "llama-tiny.json")) as f:
            m = json.load(f)
        ref, params, stages = Llama(m, recompute=False), llama_params(m), (1, 3)
    if attention is not None:
        m["attention"] = attention
    return m, ref, params, stages


def pieces(params):
    """Every (reference name, Hugging Face name, transposed), in file order."""
    return [(r, h, t) for ps, t in params for r, h in ps]


def write_safetensors(path, model, params):
    sd = model.state_dict()
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for ref, hf, tr in pieces(params):
        x = sd[ref].detach().float()
        x = (x.t() if tr else x).contiguous()
        b = x.numpy().tobytes()
        header[hf] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        assert d["dtype"] == "F32", (name, d["dtype"])
        b, e = d["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]),
                                     dtype=torch.float32).view(d["shape"])
    return out


def checkpoint_section(path, model, params, skip):
    """An fp32 section of a Ballast checkpoint, `skip(section_bytes)` bytes after its header
    (header_bytes at offset 12, section_bytes at 104): every parameter's tensor at 64-byte
    offsets, a fused parameter split into its pieces."""
    with open(path, "rb") as f:
        raw = f.read()
    header_bytes = struct.unpack_from("<I", raw, 12)[0]
    section = struct.unpack_from("<q", raw, 104)[0]
    at, sd, out = header_bytes + skip(section), model.state_dict(), {}
    first = at
    for ps, _ in params:
        start = at
        for ref, _ in ps:
            n = sd[ref].numel()
            out[ref] = torch.frombuffer(bytearray(raw[at:at + 4 * n]),
                                        dtype=torch.float32).view(sd[ref].shape)
            at += 4 * n
        at = start + (at - start + 63) // 64 * 64
    assert at - first == section, "the section's size"
    return out


def checkpoint_grads(path, model, params):
    """The gradient section of an fp32 checkpoint: weights | gradients | m | v."""
    return checkpoint_section(path, model, params, lambda section: section)


def run(args, cwd):
    p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("test_numerics_torch: %s: exit %d\n%s" % (" ".join(args), p.returncode,
                                                          p.stderr))
    return p


def plan(ballast, work, model, n_stages):
    with open(os.path.join(work, "model.json"), "w") as f:
        json.dump(model, f)
    run([ballast, "profile", "--model", "model.json", "--estimate", "--device", "cpu",
         "-o", "prof.json"], work)
    cluster = {"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": M,
               "stages": [{"device": "cpu", "memory_bytes": 1 << 30, "profile": "prof.json"}]
               * n_stages}
    name = "cluster-%d.json" % n_stages
    with open(os.path.join(work, name), "w") as f:
        json.dump(cluster, f)
    out = "plan-%d.json" % n_stages
    run([ballast, "plan", "--cluster", name, "--method", "none", "--quiet", "-o", out], work)
    return out


def train(ballast, work, model, n_stages, extra):
    args = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n_stages), ballast,
            "train", "--plan", plan(ballast, work, model, n_stages), "--threads", "1", "--quiet",
            "--init", "w0.safetensors", "--data", "tokens.bin", "--lr", str(LR),
            "--metrics", "metrics.json"] + extra
    run(args, work)
    with open(os.path.join(work, "metrics.json")) as f:
        return [s["loss"] for s in json.load(f)["steps"]]


def close(what, got, want, atol, rtol=0.0):
    diff = (got - want).abs().max().item()
    bound = atol + rtol * want.abs().max().item()
    if not diff <= bound:
        FAILS.append("%s: differs by %.3g (allowed %.3g)" % (what, diff, bound))
    return diff


def reference_steps(model, idx, targets):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    losses, grads = [], None
    for step in range(STEPS):
        opt.zero_grad()
        loss = model(idx, targets)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
    return losses, grads


def main():
    args = sys.argv[1:]
    opts = {"--kind": "gpt", "--attention": None}
    for name in opts:
        if name in args:
            at = args.index(name)
            opts[name] = args[at + 1]
            del args[at:at + 2]
    kind, attention = opts["--kind"], opts["--attention"]
    if kind not in ("gpt", "llama") or attention not in (None, "flash", "materialized"):
        sys.exit("test_numerics_torch: --kind %s --attention %s, expected gpt or llama, "
                 "flash or materialized" % (kind, attention))
    ballast = os.path.abspath(args[0])
    work = args[1] if len(args) > 1 else tempfile.mkdtemp(prefix="ballast-numerics-")
    os.makedirs(work, exist_ok=True)
    try:
        compare(ballast, work, kind, attention)
    finally:
        if len(args) <= 1:
            shutil.rmtree(work, ignore_errors=True)


def compare(ballast, work, kind, attention):
    spec, model, params, stage_counts = kind_setup(kind, attention)
    kind += "" if attention is None else ", " + attention
    T, V = spec["seq_len"], spec["vocab_size"]
    write_safetensors(os.path.join(work, "w0.safetensors"), model, params)
    seq = torch.randint(0, V, (T + 1,), generator=torch.Generator().manual_seed(1))
    with open(os.path.join(work, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, T + 1, *([0] * 253)))
        f.write(struct.pack("<%dH" % (T + 1), *seq.tolist()))
    # every row of the M micro-batches of B rows is the file's one sequence
    rows = M * spec["micro_batch"]
    idx, targets = seq[:T].repeat(rows, 1), seq[1:].repeat(rows, 1)
    ref_losses, ref_grads = reference_steps(model, idx, targets)
    final = {n: p.detach() for n, p in model.state_dict().items()}

    worst = {"loss": 0.0, "grad": 0.0, "weight": 0.0}
    for n_stages in stage_counts:
        tag = "%s, %d stage%s" % (kind, n_stages, "s" * (n_stages > 1))
        losses = train(ballast, work, spec, n_stages,
                       ["--steps", str(STEPS), "--save-weights", "w5.safetensors"])
        for i, (got, want) in enumerate(zip(losses, ref_losses)):
            d = abs(got - want)
            worst["loss"] = max(worst["loss"], d / abs(want))
            if not d <= LOSS_RTOL * abs(want):
                FAILS.append("%s: step %d loss %.9g, PyTorch %.9g" % (tag, i + 1, got, want))
        saved = read_safetensors(os.path.join(work, "w5.safetensors"))
        for ref, hf, tr in pieces(params):
            got = saved[hf].t() if tr else saved[hf]
            worst["weight"] = max(worst["weight"], close("%s: %s after %d steps" % (tag, hf, STEPS),
                                                         got, final[ref], WEIGHT_ATOL))
    # step 1's gradients, from the checkpoint of a 1-stage run (other splits give the same
    # bits: test_train)
    ck = os.path.join(work, "ck")
    train(ballast, work, spec, 1, ["--steps", "1", "--save", ck])
    grads = checkpoint_grads(os.path.join(ck, "stage-0-step-1.ckpt"), model, params)
    for ref, hf, _ in pieces(params):
        want = ref_grads[ref]
        d = close("gradient of %s" % hf, grads[ref], want, 1e-7, GRAD_TOL)
        worst["grad"] = max(worst["grad"], d / max(want.abs().max().item(), 1e-30))
    print("test_numerics_torch (%s): worst relative loss difference %.3g, worst gradient "
          "difference %.3g of the tensor's largest, worst weight difference after %d steps %.3g"
          % (kind, worst["loss"], worst["grad"], STEPS, worst["weight"]))
    if FAILS:
        print("\n".join(FAILS))
        sys.exit(1)
    print("test_numerics_torch: passed")


if __name__ == "__main__":
    main()
