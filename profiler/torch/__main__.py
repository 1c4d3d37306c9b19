"""python3 -m profiler.torch --model PKG.MODULE:FACTORY --device cpu|cuda[:N] -o PROFILE.json

FACTORY(micro_batch, seq_len) returns {"layers": [(name, nn.Module)], "tokens": tensor,
"targets": tensor, "model"?: Ballast's GPT fields (then kind gpt), "name"?: str}."""
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
    model = spec.get("model") or {"kind": "custom", "name": spec.get("name", a.model)}
    prof = profile(spec["layers"], spec["tokens"], spec["targets"], a.device, a.repeat, model)
    write(prof, a.output)
    return 0


sys.exit(main())
