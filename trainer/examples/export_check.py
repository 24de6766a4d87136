#!/usr/bin/env python3
"""Load `cannon export`'s output with transformers and compare its logits with ours.

Usage: export_check.py REFERENCE_DIR OUT_DIR   (after `cargo run --example export_check`)

Loads OUT_DIR/hf with Mistral3ForConditionalGeneration.from_pretrained (eager attention,
float32), prints the missing / unexpected / mismatched keys (all must be empty), runs the
reference batch (REFERENCE_DIR/reference.safetensors input.*) and prints the max absolute and
the relative L2 difference between transformers' logits and OUT_DIR/ours.safetensors. Needs
torch and transformers (CPU is enough); not part of the test suite.
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import Mistral3ForConditionalGeneration


def main():
    ref_dir, out = sys.argv[1], sys.argv[2]
    model, info = Mistral3ForConditionalGeneration.from_pretrained(
        f"{out}/hf", output_loading_info=True, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    print("loading info:", info)
    ref = load_file(f"{ref_dir}/reference.safetensors")
    ours = load_file(f"{out}/ours.safetensors")
    with torch.no_grad():
        o = model(
            input_ids=ref["input.input_ids"],
            pixel_values=ref["input.pixel_values"].float(),
            image_sizes=ref["input.image_sizes"],
            labels=ref["input.labels"],
        )
    a, b = o.logits.double(), ours["logits"].double()
    diff = (a - b).abs().max().item()
    rel = ((a - b).norm() / b.norm().clamp_min(1e-10)).item()
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}")
    print(f"logits {tuple(a.shape)}: max |diff| {diff:.3e}, relative L2 {rel:.3e}")
    print(f"loss: transformers {o.loss.item():.7f}, ours {ours['loss'].item():.7f}")
    if bad:
        print("FAIL: keys", bad)
        sys.exit(1)


if __name__ == "__main__":
    main()
