"""profiler.torch on Hugging Face transformers models built from configs at small sizes (random
weights, nothing downloaded):
- act_bytes of the embedding and of every block exactly what autograd saves while the unmodified
  model runs forward as Hugging Face runs it (model(input_ids, labels)), each saved storage
  counted in the decoder layer running when it was saved, the model's parameters and buffers
  left out; for GPT-2 the causal-mask buffer is what leaving buffers out removes; GPT-2 and
  Llama in fp32 and bf16, Mistral and Qwen2 in fp32 (and fp16 with --device cuda);
- GPT-2's block and its attn and mlp options by hand (what PyTorch 1.13 saves on CPU);
- the kinds and fields: GPT-2 gpt, Llama and Mistral llama, Qwen2 (q/k/v biases) and Mistral
  with a window shorter than the sequence custom; state bytes from parameter counts by hand;
- Ballast takes the gpt and llama profiles: plan, --micro-batches auto, --export megatron, and
  2 training steps on 2 ranks;
- the command line: a config.json with --set, the auto repeats and their spread reported,
  bad configs and fp16 on CPU refused with exit 2.
Run: /usr/bin/python3 tests/torch/test_profiler_hf.py BALLAST [--device cuda] from the repo
root; skipped (77) without transformers, and with --device cuda without PyTorch and a CUDA
device for the python3 running it."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_or_skip import finish, require_transformers, run_cli  # noqa: E402

DEVICE = sys.argv[3] if sys.argv[2:3] == ["--device"] else "cpu"
if DEVICE != "cpu":  # the GPU twin runs the python3 on PATH: a GPU machine's own PyTorch
    try:
        import torch  # noqa: E402

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        print("test_profiler_hf: skipped: no CUDA device (or no PyTorch) for %s" % sys.executable)
        sys.exit(77)
require_transformers("test_profiler_hf")
import torch  # noqa: E402,F811

from profiler.torch import hf, profile  # noqa: E402

B, T, C, H, KV, F, V, P, L = 2, 16, 32, 4, 2, 48, 64, 32, 2
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SETS = {"gpt2": ["n_layer=%d" % L, "n_embd=%d" % C, "n_head=%d" % H, "vocab_size=%d" % V,
                 "n_positions=%d" % P],
        "llama": ["num_hidden_layers=%d" % L, "hidden_size=%d" % C,
                  "num_attention_heads=%d" % H, "num_key_value_heads=%d" % KV,
                  "intermediate_size=%d" % F, "vocab_size=%d" % V, "rope_theta=500000",
                  "rms_norm_eps=1e-05"]}
SETS["mistral"] = SETS["qwen2"] = SETS["llama"]
FAILS = []


def check(what, got, want):
    if got != want:
        FAILS.append("%s: %r, expected %r" % (what, got, want))


def model_of(model_type, dtype="fp32", extra=()):
    return hf.build(hf.load_config(model_type, SETS[model_type] + list(extra)), dtype)


def blocks_of(model):
    return model.transformer.h if model.config.model_type == "gpt2" else model.model.layers


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def reference(model, tokens, device):
    """What autograd saves while the model runs forward as Hugging Face runs it: per planning
    layer before the head ("embed", "block.i"), the bytes of the distinct storages saved while
    it ran, parameters and buffers left out; and the bytes of the buffers that were saved."""
    model.to(device).train()
    params = {_storage(t).data_ptr() for t in model.parameters()}
    buffer_storages = {_storage(t).data_ptr() for t in model.buffers()}
    current, saved, buffers, handles = ["embed"], {}, {}, []
    for i, blk in enumerate(blocks_of(model)):
        handles.append(blk.register_forward_pre_hook(
            lambda _m, _a, i=i: current.__setitem__(0, "block.%d" % i)))
        handles.append(blk.register_forward_hook(
            lambda _m, _a, _o: current.__setitem__(0, "after")))

    def pack(t):
        s = _storage(t)
        n = s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()
        if s.data_ptr() in buffer_storages:
            buffers[s.data_ptr()] = n
        elif s.data_ptr() not in params:
            saved.setdefault(current[0], {})[s.data_ptr()] = n
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=tokens.to(device), labels=tokens.to(device), use_cache=False)
    for h in handles:
        h.remove()
    model.to("cpu")
    return {k: sum(v.values()) for k, v in saved.items()}, sum(buffers.values())


def test_saved_exactly(model_type, dtype, device):
    """The profiler's act_bytes against the whole model's saved tensors."""
    model = model_of(model_type, dtype)
    spec = hf.prepare(model, B, T)
    want, buffer_bytes = reference(model, spec["tokens"], device)
    prof = profile(spec["layers"], spec["tokens"], spec["targets"], device, 1,
                   model=spec["model"], memory_bytes=1 << 30)
    tag = "%s %s %s" % (model_type, dtype, device)
    for layer in prof["layers"][:-1]:
        check("%s %s act_bytes against the model's own forward" % (tag, layer["name"]),
              layer["act_bytes"], want.get(layer["name"]))
    # transformers 4: each GPT-2 block's causal mask, a (1, 1, P, P) bool buffer ("bias"), is
    # saved by its torch.where; 5 has no such buffer
    masks = model_type == "gpt2" and hasattr(blocks_of(model)[0].attn, "bias")
    check(tag + ": buffers autograd saved", buffer_bytes, L * P * P if masks else 0)
    return prof


def gpt2_by_hand(prof):
    """What PyTorch 1.13 saves for GPT2Block on CPU in fp32 (dropout 0.1 saves a float noise
    tensor there): BTC-sized ln_1 input and output, the q, k and v copies matmul makes, c_proj's
    input, the residual dropout's noise, ln_2's input and output, the MLP dropout's noise;
    (B,T,4C): c_fc's output, tanh's, 0.5 x, 1 + tanh, the GELU's output; (B,H,T,T): softmax's
    output, the attention dropout's noise and output; each LayerNorm's mean and rstd; the 0-d
    attention scale (fp32) and the three Python numbers the GELU multiplies by (fp64)."""
    BTC, BHTT = B * T * C, B * H * T * T
    attn = 4 * (3 * BTC + 3 * BHTT) + 4
    mlp = 4 * 4 * 4 * BTC + 3 * 8
    want = 4 * (7 * BTC + 4 * B * T) + attn + mlp + 4 * 4 * BTC
    for blk in prof["layers"][1:-1]:
        check("gpt2 %s act_bytes by hand" % blk["name"], blk["act_bytes"], want)
        opts = {o["name"]: o for o in blk.get("recompute_options", [])}
        check("gpt2 options", sorted(opts), ["attn", "attn+mlp", "mlp"])
        for name, freed in (("attn", attn), ("mlp", mlp), ("attn+mlp", attn + mlp)):
            o = opts.get(name, {})
            check("gpt2 %s transient by hand" % name, o.get("transient_bytes"), freed)
            check("gpt2 %s kept" % name, o.get("kept_bytes"), blk["act_bytes"] - freed)
            if not o.get("recompute_ms", 0) > 0:
                FAILS.append("gpt2 %s recompute_ms %r" % (name, o.get("recompute_ms")))


def state_by_hand(prof, tag, counts, per_param):
    for layer, n in zip(prof["layers"], counts):
        check("%s %s state_bytes (%d parameters)" % (tag, layer["name"], n),
              layer["state_bytes"], per_param * n)


def test_kinds(gpt2, llama):
    common = {"seq_len": T, "vocab_size": V, "micro_batch": B}
    check("gpt2 model", gpt2["model"], dict(common, kind="gpt", n_layer=L, n_embd=C, n_head=H,
                                            dtype="fp32"))
    check("gpt2 layer names", [x["name"] for x in gpt2["layers"]],
          ["embed"] + ["block.%d" % i for i in range(L)] + ["head"])
    state_by_hand(gpt2, "gpt2", [V * C + P * C] + [12 * C * C + 13 * C] * L + [2 * C + V * C], 16)
    want = dict(common, kind="llama", n_layer=L, n_embd=C, n_head=H, n_kv_head=KV,
                ffn_hidden=F, rope_theta=500000.0, norm_eps=1e-5, dtype="fp32")
    check("llama model", llama["model"], want)
    block = 2 * C * C + 2 * C * (C // H * KV) + 3 * C * F + 2 * C
    state_by_hand(llama, "llama", [V * C] + [block] * L + [C + V * C], 16)
    opts = [sorted(o["name"] for o in x.get("recompute_options", [])) for x in llama["layers"]]
    check("llama options (no attention core in its eager attention)", opts,
          [[]] + [["mlp"]] * L + [[]])
    for blk in llama["layers"][1:-1]:
        mlp = blk["recompute_options"][0]
        check("llama mlp transient: the SiLU output", mlp["transient_bytes"], 4 * B * T * F)
    mistral = hf.prepare(model_of("mistral"), B, T)
    check("mistral kind", mistral["model"], want)
    qwen2 = hf.prepare(model_of("qwen2"), B, T)
    check("qwen2 kind", qwen2["model"], {"kind": "custom", "name": "qwen2"})
    check("qwen2 reason", (qwen2["custom_why"] or "")[:20], "biases in its blocks")
    window = hf.prepare(model_of("mistral", extra=["sliding_window=8"]), B, T)
    check("mistral with a short window", window["model"]["kind"], "custom")
    bf16 = hf.prepare(model_of("llama", "bf16"), B, T)
    check("llama bf16 dtype", bf16["model"].get("dtype"), "bf16")


def run(args, work, want=0):
    p = subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=300)
    if p.returncode != want:
        FAILS.append("%s: exit %d, expected %d: %s" % (" ".join(args[:4]), p.returncode, want,
                                                      p.stderr[-2000:]))
    return p


def test_ballast_takes(ballast, prof, tag, work):
    """plan on two CPU stages, --micro-batches auto, --export megatron, 2 steps on 2 ranks."""
    path = os.path.join(work, "hf-%s.json" % tag)
    with open(path, "w") as f:
        json.dump(prof, f)
    stage = {"device": "cpu", "memory_bytes": 1 << 30, "profile": path}
    cluster = os.path.join(work, "hf-cluster-%s.json" % tag)
    with open(cluster, "w") as f:
        json.dump({"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 4,
                   "stages": [stage, stage]}, f)
    plan = os.path.join(work, "hf-plan-%s.json" % tag)
    run([ballast, "plan", "--cluster", cluster, "--quiet", "-o", plan], work)
    run([ballast, "plan", "--cluster", cluster, "--micro-batches", "auto", "--global-batch",
         "16", "--quiet", "-o", plan + ".auto"], work)
    out = run([ballast, "plan", "--cluster", cluster, "--export", "megatron", "--quiet", "-o",
               plan + ".export"], work).stdout
    if "--pipeline-model-parallel-size 2" not in out:
        FAILS.append("%s: the Megatron-LM export has no pipeline size: %s" % (tag, out))
    run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", ballast, "train",
         "--plan", plan, "--steps", "2", "--threads", "1", "--quiet", "--metrics",
         plan + ".metrics"], work)


def hf_factory(micro_batch, seq_len):
    """For --model: a transformers model built by the caller, split as --hf splits it."""
    return {"model": model_of("gpt2")}


def refused(argv, says):
    """The command line refuses argv with exit 2 and one line that says `says`."""
    code, err = run_cli(argv)
    if code != 2 or says not in err or len(err.splitlines()) != 1:
        FAILS.append("%s: exit %r, %r does not say %r in one line" % (" ".join(argv), code, err,
                                                                     says))


def test_command_line(work, device):
    """A config.json with --set and auto repeats, as a user runs it; the refusals."""
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump({"model_type": "llama", "hidden_size": C, "num_attention_heads": H,
                   "num_key_value_heads": KV, "intermediate_size": F, "vocab_size": V,
                   "num_hidden_layers": 8, "torch_dtype": "float16"}, f)
    out = os.path.join(work, "cli.json")
    size = ["--device", device, "--micro-batch", str(B), "--seq-len", str(T), "-o", out]
    p = run([sys.executable, "-m", "profiler.torch", "--hf", config, "--set",
             "num_hidden_layers=%d" % L] + size, ROOT)
    with open(out) as f:
        prof = json.load(f)
    check("config.json with --set: kind, layers, dtype (fp32 whatever the file's torch_dtype)",
          (prof["model"]["kind"], prof["model"]["n_layer"], prof["model"]["dtype"]),
          ("llama", L, "fp32"))
    for span in prof["provenance"]["spans"]:
        for k in ("fwd", "bwd"):
            if not span[k]["runs"] >= 3 or "spread_pct" not in span[k]:
                FAILS.append("auto repeats: %s %s: %r" % (span["layer"], k, span[k]))
    check("the source recorded", prof["provenance"]["transformers"]["version"],
          hf.transformers_module().__version__)
    if "timed runs per span: " not in p.stderr or "; spread at most " not in p.stderr:
        FAILS.append("no spread reported: %s" % p.stderr)
    code, err = run_cli(["--model", "test_profiler_hf:hf_factory", "--dtype", "bf16"] + size)
    with open(out) as f:
        got = json.load(f)["model"]
    check("a factory's transformers model: exit, kind, dtype",
          (code, got["kind"], got.get("dtype")), (0, "gpt", "bf16"))
    refused(["--hf", "bert"] + size, "--hf bert")
    refused(["--hf", os.path.join(work, "none.json")] + size, "none.json")
    refused(["--hf", config, "--set", "n_layers=2"] + size, "--set n_layers=2")
    refused(["--hf", "gpt2", "--set", "n_layer"] + size, "--set n_layer")
    refused(["--hf", "gpt2", "--seq-len", "2048", "-o", out], "--seq-len 2048")
    # fp16 on the CPU: refused where PyTorch cannot compute it there (1.13), measured where it
    # can (2.x)
    fp16_cpu = ["--hf", config, "--set", "num_hidden_layers=%d" % L, "--dtype", "fp16",
                "--device", "cpu", "--micro-batch", str(B), "--seq-len", str(T), "-o", out]
    try:
        a = torch.ones(2, 2, dtype=torch.float16)
        torch.softmax(a @ a, -1)
    except RuntimeError:
        refused(fp16_cpu, "--dtype fp16")
    else:
        code, err = run_cli(fp16_cpu)
        with open(out) as f:
            got = json.load(f)["model"].get("dtype")
        check("fp16 on a CPU that computes it: exit, dtype", (code, got), (0, "fp16"))


def main():
    ballast, device = os.path.abspath(sys.argv[1]), DEVICE
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        if device == "cpu":
            gpt2 = test_saved_exactly("gpt2", "fp32", device)
            if torch.__version__.startswith("1.13."):  # what gpt2_by_hand counts
                gpt2_by_hand(gpt2)
            llama = test_saved_exactly("llama", "fp32", device)
            test_kinds(gpt2, llama)
            for model_type in ("mistral", "qwen2"):
                test_saved_exactly(model_type, "fp32", device)
            test_ballast_takes(ballast, gpt2, "gpt2", work)
            test_ballast_takes(ballast, llama, "llama", work)
        for model_type in ("gpt2", "llama"):
            for dtype in ("bf16",) if device == "cpu" else ("bf16", "fp16"):
                prof = test_saved_exactly(model_type, dtype, device)
                check("%s %s dtype" % (model_type, dtype), prof["model"]["dtype"], dtype)
                n = sum(p.numel() for p in model_of(model_type).parameters())
                state = sum(x["state_bytes"] for x in prof["layers"])
                tied = V * C if model_type == "gpt2" else 0  # counted in embed and head
                check("%s %s state: 18 bytes a parameter" % (model_type, dtype), state,
                      18 * (n + tied))
        test_command_line(work, device)
    return finish("test_profiler_hf", FAILS)


if __name__ == "__main__":
    sys.exit(main())
