"""bench/gpu's helpers against hand-made numbers: nvidia-smi names to device-table names
(unknown rather than a guess), and the model FLOPs behind MFU."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "gpu"))
sys.dont_write_bytecode = True
from device_name import device_name  # noqa: E402
from report import flops_per_token, peak_flops  # noqa: E402

assert device_name("NVIDIA H100 80GB HBM3") == "H100-80GB"
assert device_name("NVIDIA H200") == "H200"
assert device_name("NVIDIA H100 PCIe") == "unknown"   # another peak than the SXM part
assert device_name("NVIDIA H200 NVL") == "unknown"
assert device_name("NVIDIA A100-SXM4-80GB") == "A100-80GB"
# GPT-2 124M shapes: 6 x (12 x 12 x 768^2 + 50257 x 768) + 12 x 12 x 768 x 1024
m = json.load(open(os.path.join(os.path.dirname(__file__), "..", "configs", "models",
                                "gpt-125m.json")))
assert flops_per_token(m) == 6 * (84934656 + 38597376) + 113246208 == 854438400
assert peak_flops("H100-80GB", "bf16") == 989e12
assert peak_flops("H100-80GB", "fp32") == 67e12
assert peak_flops("unknown", "bf16") is None
# fp16: the fp16 tensor peak (the V100's 125, not its 15.7 fp32), unknown where not stated
assert peak_flops("V100-32GB", "fp16") == 125e12
assert peak_flops("T4", "fp16") == 65e12
import report  # noqa: E402
import tempfile  # noqa: E402
table = json.load(open(report.DEVICES))
for d in table["devices"]:
    d.pop("peak_tflops_fp16")
with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
    json.dump(table, f)
    f.flush()
    report.DEVICES = f.name
    assert peak_flops("V100-32GB", "fp16") is None
    assert peak_flops("V100-32GB", "fp32") == 15.7e12
print("bench/gpu helpers: 13 checks passed")
