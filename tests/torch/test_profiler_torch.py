"""profiler.torch on a GPT-2-like model in Ballast's GPT shape and on a Llama-like one, both
built here, on CPU: every byte count against sizes computed by hand from what PyTorch saves,
and `ballast plan --verify` on both profiles (kind gpt and kind custom): the DP against GLPK,
within memory, and the short stage's recompute time against brute force.
Run: /usr/bin/python3 tests/torch/test_profiler_torch.py BALLAST [WORKDIR] from the repo root."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_or_skip import finish, require_torch  # noqa: E402

require_torch("test_profiler_torch")
import torch  # noqa: E402
from torch import nn  # noqa: E402

from profiler.torch import profile  # noqa: E402

B, T, C, H, V, L = 2, 16, 32, 4, 64, 2
F = 48  # the Llama-like MLP's width
FAILS = []


def check(what, got, want):
    if got != want:
        FAILS.append("%s: %r, by hand %r" % (what, got, want))


class Core(nn.Module):
    """softmax(q k^T) v on views of the qkv projection (the scale left in its weights): the
    products save contiguous copies of q, k and v, the softmax its probabilities."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


class Attn(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.n_head = H
        self.qkv = nn.Linear(C, 3 * C, bias=bias)
        self.core_attn = Core()
        self.proj = nn.Linear(C, C, bias=bias)

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = self.core_attn(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class GptBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = Attn(True)
        self.fc, self.act, self.out = nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GptEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)

    def forward(self, tokens):
        return self.wte(tokens) + self.wpe(torch.arange(T))


class GptHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.lm = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, x):
        return self.lm(self.ln(x))


class RmsNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RmsNorm(), RmsNorm()
        self.attn = Attn(False)
        self.gate, self.up = nn.Linear(C, F, bias=False), nn.Linear(C, F, bias=False)
        self.act_fn, self.down = nn.SiLU(), nn.Linear(F, C, bias=False)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        h = self.n2(x)
        return x + self.down(self.act_fn(self.gate(h)) * self.up(h))


def gpt_layers():
    return [("embed", GptEmbed())] + [("block.%d" % i, GptBlock()) for i in range(L)] + \
        [("head", GptHead())]


def llama_layers():
    return [("embed", nn.Embedding(V, C))] + [("block.%d" % i, LlamaBlock()) for i in range(L)] + \
        [("head", nn.Sequential(RmsNorm(), nn.Linear(C, V, bias=False)))]


def state(layer, n):
    check(layer["name"] + " param_bytes", layer["param_bytes"], 4 * n)
    check(layer["name"] + " grad_bytes", layer["grad_bytes"], 4 * n)
    check(layer["name"] + " optimizer_bytes", layer["optimizer_bytes"], 8 * n)
    check(layer["name"] + " state_bytes", layer["state_bytes"], 16 * n)


def options(layer, attn, mlp):
    got = {o["name"]: o for o in layer.get("recompute_options", [])}
    check(layer["name"] + " options", sorted(got), ["attn", "attn+mlp", "mlp"])
    for name, freed in (("attn", attn), ("mlp", mlp), ("attn+mlp", attn + mlp)):
        o = got.get(name, {})
        check(layer["name"] + " " + name + " transient_bytes", o.get("transient_bytes"), freed)
        check(layer["name"] + " " + name + " kept_bytes", o.get("kept_bytes"),
              layer["act_bytes"] - freed)
        if not o.get("recompute_ms", 0) > 0:
            FAILS.append("%s %s: recompute_ms %r" % (layer["name"], name, o.get("recompute_ms")))


def brute_force(layers, in_flight, limit):
    """The least recompute ms of a stage over every choice of every layer (keep, whole,
    each option) under the cost model's memory (docs/cost-model.md): sum state + v sum kept + max transient + max
    workspace <= limit; None if nothing fits."""
    import itertools
    menus = []
    for x in layers:
        menu = [(x["act_bytes"], 0, 0.0), (x["ckpt_bytes"], x["act_bytes"] - x["ckpt_bytes"],
                                            x["fwd_ms"])]
        menu += [(o["kept_bytes"], o["transient_bytes"], o["recompute_ms"])
                 for o in x.get("recompute_options", [])]
        menus.append(menu)
    state = sum(x["state_bytes"] for x in layers)
    work = max(x["workspace_bytes"] for x in layers)
    best = None
    for pick in itertools.product(*menus):
        memory = state + in_flight * sum(k for k, _, _ in pick) + \
            max(t for _, t, _ in pick) + work
        ms = sum(r for _, _, r in pick)
        if memory <= limit and (best is None or ms < best):
            best = ms
    return best


def plan_short_stage(prof, ballast, work, tag):
    """`ballast plan --verify` on the profile over two stages, the first (two layers, two
    micro-batches in flight) short of keeping everything: exit 0, GLPK agreeing, stage 0
    recomputing exactly brute force's least time."""
    path = os.path.join(work, "torch-%s.json" % tag)
    with open(path, "w") as f:
        json.dump(prof, f)
    # stage 0 (embed, block.0, two micro-batches in flight) short of keeping everything
    e0, b0 = prof["layers"][0], prof["layers"][1]
    short = e0["state_bytes"] + b0["state_bytes"] + 2 * (e0["act_bytes"] + b0["act_bytes"]) + \
        b0["workspace_bytes"] - b0["act_bytes"] // 2
    cluster = {"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 4,
               "stages": [{"device": "cpu", "memory_bytes": short, "profile": path,
                           "layers": [0, 1]},
                          {"device": "cpu", "memory_bytes": 1 << 30, "profile": path,
                           "layers": [2, L + 1]}]}
    cpath = os.path.join(work, "torch-cluster-%s.json" % tag)
    with open(cpath, "w") as f:
        json.dump(cluster, f)
    plan_path = os.path.join(work, "torch-plan-%s.json" % tag)
    # --min-gain 0: the fastest plan, brute force's least recompute (the default margin may
    # keep a simpler, slower choice)
    run = subprocess.run([ballast, "plan", "--cluster", cpath, "--verify", "--unit", "1",
                          "--min-gain", "0", "-o", plan_path],
                         capture_output=True, text=True)
    if run.returncode != 0:
        FAILS.append(tag + " ballast plan --verify on the profile: exit %d: %s" %
                     (run.returncode, run.stderr))
        return
    with open(plan_path) as f:
        plan = json.load(f)
    if not plan["verify"]["agree"]:
        FAILS.append(tag + " plan: DP and GLPK disagree")
    if not plan["stages"][0]["recompute"] and not plan["stages"][0].get("recompute_options"):
        FAILS.append(tag + " plan: stage 0 recomputes nothing though short of memory")
    best = brute_force(prof["layers"][:2], 2, short)
    if best is None or abs(plan["stages"][0]["recompute_ms"] - best) > 1e-9 * max(1.0, best):
        FAILS.append(tag + " plan: stage 0 recomputes %r ms, brute force %r" %
                     (plan["stages"][0]["recompute_ms"], best))
    for st in plan["stages"]:
        if st["memory_bytes"] > st["memory_limit_bytes"]:
            FAILS.append(tag + " plan: stage %d over its memory" % st["index"])


def test_gpt(ballast, work):
    torch.manual_seed(0)
    tokens, targets = torch.randint(V, (B, T)), torch.randint(V, (B, T))
    prof = profile(gpt_layers(), tokens, targets, "cpu", 2, memory_bytes=1 << 30)
    check("recognised as Ballast's GPT", prof["model"],
          {"kind": "gpt", "n_layer": L, "n_embd": C, "n_head": H, "seq_len": T,
           "vocab_size": V, "micro_batch": B, "dtype": "fp32"})
    embed, blocks, head = prof["layers"][0], prof["layers"][1:-1], prof["layers"][-1]
    check("names", [x["name"] for x in prof["layers"]],
          ["embed"] + ["block.%d" % i for i in range(L)] + ["head"])
    state(embed, V * C + T * C)
    check("embed act_bytes (token and position indices)", embed["act_bytes"], 8 * B * T + 8 * T)
    check("embed out_bytes", embed["out_bytes"], 4 * B * T * C)
    for blk in blocks:
        state(blk, 12 * C * C + 13 * C)
        # input, ln1 out, the copies of q, k and v, probabilities, attention out, residual,
        # ln2 out, fc out, GELU out; each LayerNorm's mean and rstd
        want = 4 * (B * T * C * (1 + 1 + 3 + 1 + 1 + 1 + 4 + 4) + B * H * T * T + 4 * B * T)
        check(blk["name"] + " act_bytes", blk["act_bytes"], want)
        check(blk["name"] + " ckpt_bytes", blk["ckpt_bytes"], 4 * B * T * C)
        check(blk["name"] + " out_bytes", blk["out_bytes"], 4 * B * T * C)
        options(blk, 4 * (B * H * T * T + 3 * B * T * C), 4 * B * T * 4 * C)
        for k in ("fwd_ms", "bwd_ms"):
            if not blk[k] > 0:
                FAILS.append("%s %s %r" % (blk["name"], k, blk[k]))
    state(head, 2 * C + C * V)
    if head["act_bytes"] < 4 * (2 * B * T * C + B * T * V):
        FAILS.append("head act_bytes %d below its input, norm out and log-probabilities"
                     % head["act_bytes"])
    plan_short_stage(prof, ballast, work, "gpt")


def test_llama(ballast, work):
    torch.manual_seed(0)
    tokens, targets = torch.randint(V, (B, T)), torch.randint(V, (B, T))
    prof = profile(llama_layers(), tokens, targets, "cpu", 2, "llama-like", memory_bytes=1 << 30)
    check("model", prof["model"], {"kind": "custom", "name": "llama-like"})
    embed, blocks, head = prof["layers"][0], prof["layers"][1:-1], prof["layers"][-1]
    state(embed, V * C)
    for blk in blocks:
        state(blk, 4 * C * C + 3 * C * F + 2 * C)
        options(blk, 4 * (B * H * T * T + 3 * B * T * C), 4 * B * T * F)
    state(head, C + C * V)
    plan_short_stage(prof, ballast, work, "llama")


def factory(micro_batch, seq_len):
    """For the command line: the GPT-2-like model (its T fixed by the position table); touches
    the file $PROFILER_TORCH_TEST_MARK when set, so a test can tell whether it ran."""
    assert seq_len == T
    if os.environ.get("PROFILER_TORCH_TEST_MARK"):
        open(os.environ["PROFILER_TORCH_TEST_MARK"], "w").close()
    torch.manual_seed(0)
    return {"layers": gpt_layers(), "tokens": torch.randint(V, (micro_batch, T)),
            "targets": torch.randint(V, (micro_batch, T))}


def raising_factory(micro_batch, seq_len):
    raise ValueError("no model of %d x %d" % (micro_batch, seq_len))


def list_factory(micro_batch, seq_len):
    return [("embed", nn.Embedding(V, C))]


def failing_layer_factory(micro_batch, seq_len):
    """A model whose second layer cannot take the first one's output."""
    return {"layers": [("embed", nn.Embedding(V, C)), ("bad", nn.Linear(C + 1, C)),
                       ("head", nn.Linear(C, V))],
            "tokens": torch.randint(V, (micro_batch, seq_len)),
            "targets": torch.randint(V, (micro_batch, seq_len))}


NOT_A_FUNCTION = 3
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = "test_profiler_torch:"


def cli_process(args):
    """python3 -m profiler.torch ARGS as a user runs it, the model from this file."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "profiler.torch"] + args, capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)


def one_line(what, code, err, want_code, says):
    if code != want_code or says not in err or len(err.splitlines()) != 1 or "Traceback" in err:
        FAILS.append("%s: exit %r, stderr %r; expected exit %d and one line saying %r"
                     % (what, code, err, want_code, says))


def test_command_line(work):
    """python3 -m profiler.torch from the repo root, the model from this file: a profile, and
    issue 27's defects: factory errors and bad counts answered in one line with exit 2 (the
    layer that fails while profiling: exit 1), -o refused before profiling, replaced whole."""
    out = os.path.join(work, "cli.json")
    size = ["--micro-batch", str(B), "--seq-len", str(T), "--repeat", "1"]
    run = cli_process(["--model", HERE + "factory"] + size + ["-o", out])
    check("command line exit", (run.returncode, run.stderr[-500:] if run.returncode else ""),
          (0, ""))
    with open(out) as f:
        prof = json.load(f)
    check("command line format", prof["format"], "ballast-profile/1")
    check("command line kind", prof["model"]["kind"], "gpt")
    check("command line layers", len(prof["layers"]), L + 2)
    bad = cli_process(["--model", HERE + "raising_factory", "-o", out])
    one_line("a factory that raises", bad.returncode, bad.stderr, 2,
             "--model test_profiler_torch:raising_factory: raising_factory(1, 128) raised "
             "ValueError: no model of 1 x 128")
    bad = cli_process(["--model", HERE + "factory", "--repeat", "0", "-o", out])
    one_line("--repeat 0", bad.returncode, bad.stderr, 2, "argument --repeat: 0, expected")
    with open(out) as f:
        check("a refused run leaves -o as it was", json.load(f), prof)
    sys.path.insert(0, REPO)
    from torch_or_skip import run_cli
    for args, says in (
            (["--micro-batch", "0"], "argument --micro-batch: 0, expected at least 1"),
            (["--seq-len", "0"], "argument --seq-len: 0, expected at least 1"),
            (["--seq-len", "x"], "argument --seq-len: 'x' is not a whole number"),
            (["--repeat", "-2"], "argument --repeat: -2, expected at least 1"),
            (["--dtype", "fp16"], "--dtype fp16: PyTorch"),
            (["--device", "tpu"], "--device tpu"),
            (["--model", "no_such_module:f"], "--model no_such_module:f: importing"),
            (["--model", "test_profiler_torch"], "expected PKG.MODULE:FACTORY"),
            (["--model", HERE + "NOT_A_FUNCTION"], "has no function NOT_A_FUNCTION"),
            (["--model", HERE + "list_factory"], "the factory's result is a list"),
            (["--model", HERE + "factory", "--set", "a=1"], "--set: only with --hf")):
        argv = (args if args[0] == "--model" else ["--model", HERE + "factory"] + args)
        code, err = run_cli(argv + ["-o", out])
        one_line(" ".join(args), code, err, 2, says)
    code, err = run_cli(["--model", HERE + "failing_layer_factory", "--repeat", "1", "-o", out])
    one_line("a layer that fails", code, err, 1, "layer bad (2 of 3) failed on cpu: RuntimeError")
    test_output(work, out, prof, run_cli)
    test_bf16(work, run_cli)


def test_output(work, out, prof, run_cli):
    """-o: refused before the factory runs when it cannot be written; replaced by a rename
    (a new inode, no temporary left, a killed run's removed); written through a symbolic
    link."""
    mark = os.path.join(work, "factory-ran")
    os.environ["PROFILER_TORCH_TEST_MARK"] = mark
    fifo = os.path.join(work, "fifo")
    os.mkfifo(fifo)
    ro = os.path.join(work, "ro")
    os.mkdir(ro, 0o500)
    for target, says in ((os.path.join(work, "no", "p.json"), "cannot write in"),
                         (work, "not a regular file"), (fifo, "not a regular file"),
                         (os.path.join(ro, "p.json"), "cannot write in")):
        if target.startswith(ro) and os.access(ro, os.W_OK):
            continue  # root writes anywhere
        code, err = run_cli(["--model", HERE + "factory", "--repeat", "1", "-o", target])
        one_line("-o " + target, code, err, 2, says)
        if os.path.exists(mark):
            FAILS.append("-o %s: refused only after the factory ran" % target)
    inode = os.stat(out).st_ino
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = "%s.tmp.%d.x1" % (out, dead.pid)  # as a killed run leaves it
    open(stale, "w").close()
    link = os.path.join(work, "link.json")
    os.symlink(out, link)
    size = ["--micro-batch", str(B), "--seq-len", str(T), "--repeat", "1"]
    code, err = run_cli(["--model", HERE + "factory"] + size + ["-o", link])
    check("-o through a link: exit", code, 0)
    check("-o through a link: still a link to the profile", os.readlink(link), out)
    if os.stat(out).st_ino == inode:
        FAILS.append("-o: the profile was written in place, not renamed over it")
    with open(out) as f:
        check("-o: the new profile's layers", len(json.load(f)["layers"]), len(prof["layers"]))
    left = [n for n in os.listdir(work) if ".tmp." in n]
    check("temporaries left (the killed run's removed)", left, [])
    del os.environ["PROFILER_TORCH_TEST_MARK"]


def test_bf16(work, run_cli):
    """--dtype bf16 casts the factory's layers: kind gpt in bf16, 18 bytes of state a parameter
    (2-byte weights, fp32 gradients, fp32 master weights, m and v)."""
    out = os.path.join(work, "bf16.json")
    code, err = run_cli(["--model", HERE + "factory", "--micro-batch", str(B), "--seq-len",
                         str(T), "--repeat", "1", "--dtype", "bf16", "-o", out])
    check("--dtype bf16: exit", (code, err if code else ""), (0, ""))
    with open(out) as f:
        prof = json.load(f)
    check("--dtype bf16: dtype", prof["model"].get("dtype"), "bf16")
    counts = [V * C + T * C] + [12 * C * C + 13 * C] * L + [2 * C + C * V]
    for layer, n in zip(prof["layers"], counts):
        check(layer["name"] + " bf16 state split",
              (layer["param_bytes"], layer["grad_bytes"], layer["optimizer_bytes"]),
              (2 * n, 4 * n, 12 * n))


def test_timing():
    """timing.py's policy by hand: warm-up runs untimed; equal times settle at MIN_RUNS (no
    spread); times alternating 1 and 2 (spread 1/1.5: the median's error would need ~3800
    runs to fall under 1%) stop at MAX_RUNS; a fixed repeat is that many runs."""
    from profiler.torch import timing
    calls = []

    def once(values):
        calls.append(values[len(calls) % len(values)])
        return calls[-1]

    stat = timing.measure(lambda: once([1.0]), None)
    check("equal times: runs", (stat.runs, len(calls), stat.spread),
          (timing.MIN_RUNS, timing.MIN_RUNS + timing.WARMUP, 0.0))
    calls.clear()
    budget, timing.BUDGET_S = timing.BUDGET_S, 1e9  # the count alone, however loaded the host
    stat = timing.measure(lambda: once([1.0, 2.0]), None)
    timing.BUDGET_S = budget
    check("alternating times: runs, median", (stat.runs, stat.median_ms),
          (timing.MAX_RUNS, 1.5))
    calls.clear()
    stat = timing.measure(lambda: once([1.0, 3.0, 2.0]), 3)
    check("--repeat 3: runs, median, spread (range/median under 4 runs)",
          (stat.runs, stat.median_ms, stat.spread), (3, 2.0, 1.0))


def main():
    ballast = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        test_gpt(ballast, work)
        test_llama(ballast, work)
        test_command_line(work)
    test_timing()
    return finish("test_profiler_torch", FAILS)


if __name__ == "__main__":
    sys.exit(main())
