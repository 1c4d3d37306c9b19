"""python3 -m profiler.torch (--hf CONFIG | --model PKG.MODULE:FACTORY) -o PROFILE.json

--hf CONFIG: a Hugging Face transformers causal LM built from a config with random weights,
nothing downloaded. CONFIG is a model type (gpt2, llama, mistral, qwen2: transformers' default
sizes, GPT-2 small or a 7B) or a config.json (or the folder holding one); --set KEY=VALUE
changes a field of it (VALUE as JSON: --set num_hidden_layers=4). GPT-2 becomes kind gpt and a
Llama-family model kind llama where Ballast's model is the same computation; otherwise kind
custom, and the reason is printed.

--model PKG.MODULE:FACTORY: FACTORY(micro_batch, seq_len) returns {"layers": [(name,
nn.Module)], "tokens": tensor, "targets": tensor, "name"?: str}, or a transformers causal LM
(or {"model": it}) to split as --hf does. Such a layer list is kind gpt when it is Ballast's
GPT (embed, block.0 ..., head of its sizes), else custom.

Exit status: 0 written, 2 bad arguments or model, 1 a failure while profiling. The profile is
written (atomically) only when every layer was measured."""
import argparse
import importlib
import sys

import torch

from . import DTYPES, check_dtype, parse_device, profile
from .errors import ProfileError
from .outfile import Output

LAYER_NAME_MAX = 31  # common/model.h: MODEL_LAYER_NAME_MAX less its terminator
NAME_MAX = 63  # a model's or device's name: MODEL_NAME_MAX, PROFILE_NAME_MAX less theirs


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line naming the argument, exit 2 (argparse prints the usage first)."""
        self.exit(2, "%s: %s (see --help)\n" % (self.prog, message))


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("%d, expected at least 1" % value)
    return value


def _name(text):
    if not 0 < len(text) <= NAME_MAX:
        raise argparse.ArgumentTypeError("%r, expected 1 to %d characters" % (text, NAME_MAX))
    return text


def _repeat(text):
    return None if text == "auto" else _positive(text)


def _parser():
    ap = _Parser(prog="python3 -m profiler.torch", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="CONFIG", help="gpt2|llama|mistral|qwen2|CONFIG.json")
    src.add_argument("--model", metavar="PKG.MODULE:FACTORY")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --hf: a config field (repeatable)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="cast the layers to it (--hf default fp32; --model: as built)")
    ap.add_argument("--micro-batch", type=_positive, default=1, metavar="B")
    ap.add_argument("--seq-len", type=_positive, default=128, metavar="T")
    ap.add_argument("--repeat", type=_repeat, default=None, metavar="N|auto",
                    help="timed runs per span (default auto: until the median is within 1%%)")
    ap.add_argument("--seed", type=int, default=0, help="--hf: the random weights' seed")
    ap.add_argument("--name", type=_name,
                    help="the device's name in the profile, which cluster files must use "
                         "(default the CUDA device's name, or cpu)")
    ap.add_argument("--model-name", type=_name,
                    help="a custom model's name (default the factory's, or the model type)")
    ap.add_argument("-o", "--output", required=True, metavar="PROFILE.json")
    return ap


def _first_line(exc):
    return "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])


def _factory(a):
    """FACTORY(micro_batch, seq_len), every failure a ProfileError naming --model."""
    mod, sep, fn = a.model.partition(":")
    if not sep or not mod or not fn:
        raise ProfileError("--model %s: expected PKG.MODULE:FACTORY" % a.model)
    try:
        factory = getattr(importlib.import_module(mod), fn, None)
    except Exception as exc:  # ImportError, or whatever the module raised at import
        raise ProfileError("--model %s: importing %s: %s" % (a.model, mod, _first_line(exc))) \
            from None
    if not callable(factory):
        raise ProfileError("--model %s: %s has no function %s" % (a.model, mod, fn))
    try:
        return factory(a.micro_batch, a.seq_len)
    except Exception as exc:
        raise ProfileError("--model %s: %s(%d, %d) raised %s"
                           % (a.model, fn, a.micro_batch, a.seq_len, _first_line(exc))) from None


def _is_hf(obj):
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "config") and \
        hasattr(obj, "get_output_embeddings")


def _layer_spec(a, spec):
    """The factory's layer list, checked."""
    expected = ('expected {"layers": [(name, nn.Module), ...], "tokens": tensor, "targets": '
                'tensor, "name"?: str}, or a transformers causal LM')
    where = "--model %s: the factory's result" % a.model
    if not isinstance(spec, dict):
        raise ProfileError("%s is a %s; %s" % (where, type(spec).__name__, expected))
    layers = spec.get("layers")
    if not isinstance(layers, (list, tuple)) or not layers or not all(
            isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], str) and
            isinstance(x[1], torch.nn.Module) for x in layers):
        raise ProfileError("%s: layers: %s" % (where, expected))
    names = [n for n, _ in layers]
    bad = [n for n in names if not 0 < len(n) <= LAYER_NAME_MAX]
    if bad or len(set(names)) != len(names):
        raise ProfileError("%s: layers: names must be unique, 1 to %d characters (%r)"
                           % (where, LAYER_NAME_MAX, bad[0] if bad else names))
    for key in ("tokens", "targets"):
        if not torch.is_tensor(spec.get(key)):
            raise ProfileError("%s: %s: %s" % (where, key, expected))
    name = a.model_name or spec.get("name") or a.model
    if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
        raise ProfileError("%s: name: %r, expected 1 to %d characters" % (where, name, NAME_MAX))
    return {"layers": list(layers), "tokens": spec["tokens"], "targets": spec["targets"],
            "name": name, "dtype": a.dtype}


def _hf_spec(a, model):
    from . import hf
    spec = hf.prepare(model, a.micro_batch, a.seq_len, a.model_name, a.seed)
    if spec["custom_why"]:
        print("profiler.torch: kind custom: Ballast's %s is not the same computation: %s"
              % ("gpt" if model.config.model_type == "gpt2" else "llama", spec["custom_why"]),
              file=sys.stderr)
    return spec


def _spec(a):
    if a.hf is not None:
        from . import hf
        config = hf.load_config(a.hf, a.set)
        hf.check_seq_len(config, a.seq_len)  # before building what may be a 7B model
        return _hf_spec(a, hf.build(config, a.dtype or "fp32", a.seed))
    if a.set:
        raise ProfileError("--set: only with --hf")
    spec = _factory(a)
    if isinstance(spec, dict) and _is_hf(spec.get("model")):
        spec = spec["model"]
    if _is_hf(spec):
        if a.dtype is not None:
            spec.to(DTYPES[a.dtype])
        return _hf_spec(a, spec)
    return _layer_spec(a, spec)


def _progress(layer, span):
    print("profiler.torch: %-12s fwd %9.3f ms (%d runs, spread %.1f%%)  bwd %9.3f ms (%d runs, "
          "spread %.1f%%)" % (layer["name"], layer["fwd_ms"], span["fwd"]["runs"],
                              span["fwd"]["spread_pct"], layer["bwd_ms"], span["bwd"]["runs"],
                              span["bwd"]["spread_pct"]), file=sys.stderr)


def _summary(prof, path):
    spans = [(s["layer"], k, s[k]) for s in prof["provenance"]["spans"] for k in ("fwd", "bwd")]
    runs = [x["runs"] for _, _, x in spans]
    worst = max(spans, key=lambda s: s[2]["spread_pct"])
    m = prof["model"]
    what = m.get("name", "") if m["kind"] == "custom" else "%s, %s" % (m["kind"], m["dtype"])
    print("profiler.torch: %s model (%s), %d layers on %s -> %s"
          % (m["kind"], what, len(prof["layers"]), prof["device"]["name"], path), file=sys.stderr)
    count = "%d" % min(runs) if min(runs) == max(runs) else "%d to %d" % (min(runs), max(runs))
    print("profiler.torch: timed runs per span: %s; spread at most %.1f%% (%s %s)"
          % (count, worst[2]["spread_pct"], worst[0], worst[1]), file=sys.stderr)


def _run(a):
    out = Output(a.output)  # checked and its temporary made before anything is measured
    try:
        device = parse_device(a.device)
        if a.dtype is not None:
            check_dtype(device, a.dtype)
        spec = _spec(a)
        prof = profile(spec["layers"], spec["tokens"], spec["targets"], device, a.repeat,
                       spec.get("name"), model=spec.get("model"), dtype=spec.get("dtype"),
                       source=spec.get("source"),
                       progress=_progress if sys.stderr.isatty() else None,
                       device_name=a.name)
        out.commit(prof)
    finally:
        out.discard()
    _summary(prof, a.output)
    return 0


def main(argv=None):
    a = _parser().parse_args(argv)
    try:
        return _run(a)
    except ProfileError as exc:
        print("profiler.torch: %s" % exc, file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("profiler.torch: interrupted; %s left as it was" % a.output, file=sys.stderr)
        return 130

