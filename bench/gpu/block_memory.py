"""A Llama block's activation memory on the GPU, measured by PyTorch, for the planner's
framework estimate to be set against (issue: `ballast profile --estimate --for megatron`).

One block of the model (bench/torch_llama_model.py's, the arithmetic Ballast trains; attention
by F.scaled_dot_product_attention, flash attention on a GPU that has the kernel) in DTYPE with
its weights on the GPU; a micro-batch of MICRO_BATCH x seq_len tokens arrives as a neighbour's
output would (requires grad). Measured:
  saved_bytes     the tensors autograd saves for the backward (saved_tensors_hooks), each
                  storage counted once, the block's weights left out;
  allocated_bytes torch.cuda.memory_allocated after the forward minus before it, the output
                  included (what a pipeline stage holds per micro-batch in flight, with the
                  output it sends on);
  peak_bytes      torch.cuda.max_memory_allocated during the forward and the backward, above
                  what was allocated before (the transient peak);
and the forward and backward times (CUDA events, medians of REPEATS after a warm-up).

usage: block_memory.py MODEL.json [--dtype bf16] [--micro-batch 1] [--repeats 5]  -> JSON
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_llama_model import Block, rope_tables  # noqa: E402


def measure(model, dtype, b, repeats):
    dev = torch.device("cuda")
    block = Block(model, "sdpa").to(dev, dtype)
    T, C = model["seq_len"], model["n_embd"]
    # the rotary tables in the block's dtype, as Megatron-LM and Hugging Face apply them
    tables = rope_tables(T, C // model["n_head"], model["rope_theta"])
    cos, sin = (t.to(dev, dtype) for t in tables)
    weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(b, T, C, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(b, T, C, device=dev, dtype=dtype)
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights and t.device.type == "cuda":
            saved[s.data_ptr()] = s.nbytes()
        return t

    torch.cuda.synchronize()
    fwd, bwd = [], []
    allocated = peak = 0
    for r in range(repeats + 1):
        saved.clear()
        x.grad = None
        block.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(x, cos, sin)
        e[1].record()
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated() - before
        y.backward(grad)
        e[2].record()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del y
        if r:
            fwd.append(e[0].elapsed_time(e[1]))
            bwd.append(e[1].elapsed_time(e[2]))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {"saved_bytes": sum(saved.values()), "allocated_bytes": allocated,
            "peak_bytes": peak, "fwd_ms": med(fwd), "bwd_ms": med(bwd),
            "output_bytes": b * T * C * x.element_size()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    model = json.load(open(a.model))
    if model.get("kind") != "llama":
        sys.exit(f"{a.model}: kind {model.get('kind')!r}: a Llama model is measured here")
    if not torch.cuda.is_available():
        sys.exit("block_memory.py: needs a CUDA GPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    r = measure(model, dtype, a.micro_batch, a.repeats)
    r.update(model=os.path.basename(a.model), dtype=a.dtype, micro_batch=a.micro_batch,
             seq_len=model["seq_len"], gpu=torch.cuda.get_device_name(0),
             torch=torch.__version__,
             flash=torch.backends.cuda.flash_sdp_enabled())
    print(json.dumps(r))


if __name__ == "__main__":
    main()
