"""Ballast's fp16 training with dynamic loss scaling against an independent PyTorch reference
on CPU, from the same weights and data (test_numerics_torch.py's GPT, safetensors writer and
one-sequence token file):

  - the reference is bench/torch_gpt_model.py's GPT run with fp16 storage: every activation
    Ballast keeps in fp16 (each layer-norm, linear, attention score and probability, GELU and
    residual output) is rounded to fp16 on the way forward and its gradient rounded to fp16
    on the way back (Q below); the layers compute with the fp32 master weights rounded to
    fp16 (W), and the parameter gradients and AdamW stay fp32 -- what Ballast's fp16 path
    keeps, written from the definitions, not from Ballast's code;
  - its loss scaling is PyTorch's GradScaler, step for step as torch/cuda/amp/grad_scaler.py
    runs it (PyTorch 1.13: scale the loss, unscale the gradients by the fp32 reciprocal of the
    scale computed in double, skip optimizer.step() when any gradient is inf or NaN, then
    _amp_update_scale_: back off on an overflow, grow after growth_interval clean steps, the
    grown scale kept only when finite); Debian's PyTorch runs GradScaler on CUDA only, so the
    update is transcribed here (gradscaler_update) with the source's rule quoted;
  - Ballast runs `--hysteresis 1` (GradScaler has none) and a minimum below any scale reached.

Two runs, each on 1 and 2 stages: a large initial scale (2^26) whose first steps overflow
and are skipped until the scale has backed off enough, then training; and a growth interval
of 2 steps from 2^19, so the scale grows into overflows and backs off again. Compared: the
sequence of scales and skipped steps (equal), every step's loss (1e-4 relative; measured
1e-5), and the fp32 master weights after the last step, read from the checkpoint: per tensor,
the run's update (final - initial weights) within 1% of the reference's in L2 norm
(measured: 0.32% at worst; the two round activations alike but sum in other orders). The key
bias is left out: its gradient is zero in exact arithmetic (the softmax ignores a shift of a
query's every score), so AdamW, which normalises each gradient, moves it by rounding noise
alone, up to lr a step in either direction, in both. The 1- and 2-stage runs are bitwise
equal to each other (losses and checkpoints' master weights).
Run: /usr/bin/python3 tests/torch/test_fp16_torch.py BALLAST [WORKDIR] from the repo root."""
import json
import math
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_numerics_torch as tn  # noqa: E402  (requires torch, or skips)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

STEPS = 14
LR = 1e-3
LOSS_RTOL, UPDATE_RTOL = 1e-4, 1e-2
RUNS = [("overflow recovered", ["--initial-loss-scale", str(2.0 ** 26),
                                "--loss-scale-window", "1000"], 2.0 ** 26, 1000),
        ("growth into overflows", ["--initial-loss-scale", str(2.0 ** 19),
                                   "--loss-scale-window", "2"], 2.0 ** 19, 2)]
FAILS = []


class Q(torch.autograd.Function):
    """An activation kept in fp16: rounded forward, and its gradient rounded backward."""

    @staticmethod
    def forward(ctx, x):
        return x.half().float()

    @staticmethod
    def backward(ctx, g):
        return g.half().float()


class W(torch.autograd.Function):
    """The fp16 copy of a master weight the layers compute with: its gradient stays fp32."""

    @staticmethod
    def forward(ctx, x):
        return x.half().float()

    @staticmethod
    def backward(ctx, g):
        return g


def block16(b, x):
    q, w = Q.apply, W.apply
    B, T, C = x.shape
    hs = C // b.nh
    h = q(F.layer_norm(x, (C,), w(b.ln1.weight), w(b.ln1.bias), 1e-5))
    qkv = q(F.linear(h, w(b.qkv.weight), w(b.qkv.bias)))
    qq, kk, vv = (t.view(B, T, b.nh, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = q((qq @ kk.transpose(-2, -1)) * (1.0 / math.sqrt(hs)))
    att = q(scores.masked_fill(~mask, float("-inf")).softmax(dim=-1))
    y = q(att @ vv).transpose(1, 2).contiguous().view(B, T, C)
    x = q(x + F.linear(y, w(b.proj.weight), w(b.proj.bias)))
    h = q(F.layer_norm(x, (C,), w(b.ln2.weight), w(b.ln2.bias), 1e-5))
    f = q(F.linear(h, w(b.fc.weight), w(b.fc.bias)))
    g = q(F.gelu(f, approximate="tanh"))
    return q(x + F.linear(g, w(b.fcproj.weight), w(b.fcproj.bias)))


def forward16(model, idx, targets):
    q, w = Q.apply, W.apply
    T = idx.shape[1]
    x = q(F.embedding(idx, w(model.wte.weight)) + w(model.wpe.weight)[:T])
    for b in model.blocks:
        x = block16(b, x)
    C = x.shape[-1]
    h = q(F.layer_norm(x, (C,), w(model.lnf.weight), w(model.lnf.bias), 1e-5))
    logits = q(F.linear(h, w(model.lm.weight)))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def gradscaler_update(scale, tracker, found, growth, backoff, interval):
    """torch._amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu, PyTorch 1.13):
        if found_inf: scale *= backoff_factor; growth_tracker = 0
        else: successful = growth_tracker + 1
              if successful == growth_interval:
                  new_scale = scale * growth_factor
                  if isfinite(new_scale): scale = new_scale
                  growth_tracker = 0
              else: growth_tracker = successful
    with the scale an fp32 tensor (each product rounded to fp32)."""
    if found:
        return np.float32(scale * np.float32(backoff)), 0
    if tracker + 1 == interval:
        grown = np.float32(scale * np.float32(growth))
        return (grown if np.isfinite(grown) else scale), 0
    return scale, tracker + 1


def reference(model, idx, targets, initial, interval):
    """(losses, scales, skipped) of STEPS steps of GradScaler(init_scale=initial,
    growth_interval=interval) around AdamW; the model's parameters end as the masters."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    scale, tracker = np.float32(initial), 0
    losses, scales, skipped = [], [], []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = forward16(model, idx, targets)
        (loss * torch.tensor(float(scale), dtype=torch.float32)).backward()
        inv = torch.tensor(1.0 / float(scale), dtype=torch.float64).float()  # GradScaler's
        found = False
        for p in model.parameters():
            p.grad.mul_(inv)
            found |= not bool(torch.isfinite(p.grad).all())
        if not found:
            opt.step()
        losses.append(loss.item())
        scales.append(float(scale))
        skipped.append(found)
        scale, tracker = gradscaler_update(scale, tracker, found, 2.0, 0.5, interval)
    return losses, scales, skipped


def update_error(got, want, start, hf):
    """|(got - start) - (want - start)| / |want - start| in L2, the key bias left out."""
    if hf.endswith("attn.c_attn.bias"):  # q, k, v: drop k (see the top)
        C = got.numel() // 3
        keep = torch.cat([torch.arange(0, C), torch.arange(2 * C, 3 * C)])
        got, want, start = got[keep], want[keep], start[keep]
    return ((got - want).norm() / (want - start).norm()).item()


def checkpoint_masters(path, model, params):
    """The fp32 master weights of an fp16 stage's checkpoint: after the fp16 weights (each
    tensor padded to 64 bytes) and the gradients."""
    sd = model.state_dict()
    weights = sum((2 * sum(sd[r].numel() for r, _ in ps) + 63) // 64 * 64 for ps, _ in params)
    return tn.checkpoint_section(path, model, params, lambda section: weights + section)


def ballast_run(ballast, work, spec, n_stages, extra, tag):
    ck = os.path.join(work, "ck-%s-%d" % (tag, n_stages))
    shutil.rmtree(ck, ignore_errors=True)
    plan = tn.plan(ballast, work, spec, n_stages)
    args = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n_stages), ballast,
            "train", "--plan", plan, "--threads", "1",
            "--quiet", "--init", "w0.safetensors", "--data", "tokens.bin", "--lr", str(LR),
            "--metrics", "metrics.json", "--steps", str(STEPS), "--save", ck, "--hysteresis",
            "1", "--min-loss-scale", "1e-30", "--save-weights", "w.safetensors"] + extra
    tn.run(args, work)
    with open(os.path.join(work, "metrics.json")) as f:
        m = json.load(f)
    with open(os.path.join(work, "w.safetensors"), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    dtypes = {d["dtype"] for k, d in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
    if dtypes != {"F16"}:
        FAILS.append("%s: --save-weights wrote %s, expected F16" % (tag, sorted(dtypes)))
    with open(os.path.join(work, plan)) as f:
        layers = [st["layers"] for st in json.load(f)["stages"]]
    steps = m["steps"]
    return ([s["loss"] for s in steps], [s["loss_scale"] for s in steps],
            [s["skipped"] for s in steps], os.path.join(ck, "stage-%d-step-%d.ckpt"), layers)


def compare(ballast, work):
    spec = dict(tn.GPT_MODEL, dtype="fp16")
    T, V = spec["seq_len"], spec["vocab_size"]
    torch.manual_seed(0)
    model0 = tn.GPT(dict(spec), recompute=False)
    params = tn.gpt_params()
    tn.write_safetensors(os.path.join(work, "w0.safetensors"), model0, params)
    seq = torch.randint(0, V, (T + 1,), generator=torch.Generator().manual_seed(1))
    with open(os.path.join(work, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, T + 1, *([0] * 253)))
        f.write(struct.pack("<%dH" % (T + 1), *seq.tolist()))
    rows = tn.M * spec["micro_batch"]
    idx, targets = seq[:T].repeat(rows, 1), seq[1:].repeat(rows, 1)
    start = {n: p.detach().clone() for n, p in model0.state_dict().items()}
    for name, extra, initial, interval in RUNS:
        model = tn.GPT(dict(spec), recompute=False)
        model.load_state_dict(model0.state_dict())
        ref_losses, ref_scales, ref_skipped = reference(model, idx, targets, initial, interval)
        final = {n: p.detach() for n, p in model.state_dict().items()}
        runs = {}
        for n_stages in (1, 2):
            tag = "%s, %d stage%s" % (name, n_stages, "s" * (n_stages > 1))
            losses, scales, skipped, ck, layers = ballast_run(ballast, work, spec, n_stages,
                                                              extra, name.split()[0])
            masters = {}
            for s, (first, last) in enumerate(layers):
                masters.update(checkpoint_masters(ck % (s, STEPS), model,
                                                  stage_params(params, spec, first, last)))
            runs[n_stages] = (losses, masters)
            if scales != ref_scales or skipped != ref_skipped:
                FAILS.append("%s: scales %s skipped %s; GradScaler's %s skipped %s"
                             % (tag, scales, skipped, ref_scales, ref_skipped))
            worst_loss = max(abs(g - w) / abs(w) for g, w in zip(losses, ref_losses))
            if not worst_loss <= LOSS_RTOL:
                FAILS.append("%s: losses %s, the reference's %s" % (tag, losses, ref_losses))
            worst_w = 0.0
            for ref, hf, _ in tn.pieces(params):
                err = update_error(masters[ref], final[ref], start[ref], hf)
                worst_w = max(worst_w, err)
                if not err <= UPDATE_RTOL:
                    FAILS.append("%s: %s's update after %d steps differs by %.3g of the "
                                 "reference's" % (tag, hf, STEPS, err))
            print("%s: %d of %d steps skipped (scales %s); worst relative loss difference "
                  "%.3g, worst relative update difference %.3g"
                  % (tag, sum(skipped), STEPS, sorted(set(scales), reverse=True), worst_loss,
                     worst_w))
        if runs[1][0] != runs[2][0] or any(not torch.equal(runs[1][1][k], runs[2][1][k])
                                           for k in runs[1][1]):
            FAILS.append("%s: 1 and 2 stages differ" % name)
        if sum(ref_skipped) == 0 or all(ref_skipped):
            FAILS.append("%s: %d of %d steps skipped: the run tests nothing"
                         % (name, sum(ref_skipped), STEPS))


def stage_params(params, spec, first, last):
    """The parameters (tn.gpt_params' entries) of planning layers first..last (0: embed)."""
    per = [len(tn.EMBED)] + [len(tn.BLOCK)] * spec["n_layer"] + [len(tn.HEAD)]
    start = sum(per[:first])
    return params[start:start + sum(per[first:last + 1])]


def main():
    args = sys.argv[1:]
    ballast = os.path.abspath(args[0])
    work = args[1] if len(args) > 1 else tempfile.mkdtemp(prefix="ballast-fp16-")
    os.makedirs(work, exist_ok=True)
    try:
        compare(ballast, work)
    finally:
        if len(args) <= 1:
            shutil.rmtree(work, ignore_errors=True)
    if FAILS or tn.FAILS:
        print("\n".join(FAILS + tn.FAILS))
        sys.exit(1)
    print("test_fp16_torch: passed")


if __name__ == "__main__":
    main()
