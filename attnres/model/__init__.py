"""The model: nanoGPT-style GPT (gpt.py), its residual/depth-attention blocks and their kernels."""
