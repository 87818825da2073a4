"""The shipped GGUF model as a trainer's starting point."""

from __future__ import annotations

from pathlib import Path


def from_gguf(gguf: str | Path):
    """transformers' tokenizer and a plain float32 model holding a GGUF
    file's weights: what a trainer trains and saves (a GGUF-loaded model is
    marked quantized and refuses `save_pretrained`); `POST /v1/admin/load`
    takes the saved directory."""
    import torch
    import transformers

    gguf = Path(gguf)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    return tok, model
