"""Quantized bases (QLoRA: `adapter: qlora` + `load_in_4bit`; `adapter: lora` + `load_in_8bit`): what the trainer
computes with, as plain weights the server can serve (dequant.py)."""
