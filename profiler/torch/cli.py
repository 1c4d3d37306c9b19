"""python3 -m profiler.torch --model PKG.MODULE:FACTORY --device cpu|cuda[:N] -o PROFILE.json

FACTORY(micro_batch, seq_len) returns {"layers": [(name, nn.Module)], "tokens": tensor,
"targets": tensor, "name"?: str (the custom model's name)}. The profile's model is kind gpt
when the layers are Ballast's GPT (embed, block.0 ..., head of its sizes), else custom."""
import argparse
import importlib
import sys

from . import profile, write


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m profiler.torch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="PKG.MODULE:FACTORY")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    mod, _, fn = a.model.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as exc:
        print("profiler.torch: --model %s: %s" % (a.model, exc), file=sys.stderr)
        return 2
    spec = factory(a.micro_batch, a.seq_len)
    prof = profile(spec["layers"], spec["tokens"], spec["targets"], a.device, a.repeat,
                   spec.get("name", a.model))
    print("profiler.torch: %s model, %d layers -> %s" % (prof["model"]["kind"],
                                                        len(prof["layers"]), a.output),
          file=sys.stderr)
    write(prof, a.output)
    return 0


sys.exit(main())
