"""Convert a GGUF model into a Hugging Face folder that vLLM's CPU build can serve.

    python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

Run with the vLLM venv's interpreter (scripts/setup-vllm.sh does): transformers reads the GGUF
(tokenizer and weights, dequantised to bf16), and the folder is written with `save_pretrained`.
transformers marks a model loaded from a GGUF as quantized and refuses to save it; the
weights are already plain bf16 tensors by then, so the marker is dropped before saving.
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    for holder in (model, model.config):
        for attr in ("hf_quantizer", "quantization_config"):
            if getattr(holder, attr, None) is not None:
                delattr(holder, attr)
    model.is_quantized = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_to_hf.py MODEL.gguf OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
