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


def save_hf(gguf: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write a GGUF file's model as a Hugging Face directory (config,
    safetensors, tokenizer) in `dtype`: what vLLM serves, since its GGUF
    loader has no CPU kernel. Written beside `out` and renamed into place,
    so a half-written directory is never taken for a model."""
    import shutil

    import torch

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok, model = from_gguf(gguf)
    model.to(getattr(torch, dtype)).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rollcall_data.models",
                                 description="Convert a GGUF model into a Hugging Face directory.")
    ap.add_argument("--gguf", required=True, help="the GGUF file (`rollcall model fetch` prints it)")
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = ap.parse_args(argv)
    print(save_hf(a.gguf, a.out, a.dtype))


if __name__ == "__main__":
    main()
