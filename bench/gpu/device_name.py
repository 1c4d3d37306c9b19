"""The configs/devices.json name of a GPU as nvidia-smi names it, or "unknown": only exact
models whose datasheet peak the table holds (an H100 PCIe or NVL has another peak than the
SXM part the table lists, so it is unknown rather than guessed).

usage: device_name.py "NVIDIA H100 80GB HBM3"   -> H100-80GB
"""
import re
import sys

KNOWN = [
    (r"^NVIDIA H100 80GB HBM3$", "H100-80GB"),  # SXM5
    (r"^NVIDIA H200$", "H200"),                 # SXM
    (r"^NVIDIA A100-SXM4-80GB$", "A100-80GB"),
    (r"^NVIDIA A100-SXM4-40GB$", "A100-40GB"),
    (r"^Tesla V100-SXM2-32GB$", "V100-32GB"),
    (r"^NVIDIA L4$", "L4"),
    (r"^Tesla T4$", "T4"),
    (r"^NVIDIA A10$", "A10"),
    (r"^NVIDIA GeForce RTX 4090$", "RTX4090"),
]


def device_name(gpu):
    for pattern, name in KNOWN:
        if re.match(pattern, gpu.strip()):
            return name
    return "unknown"


if __name__ == "__main__":
    print(device_name(sys.argv[1]))
