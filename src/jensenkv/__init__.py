"""jensenkv: KV-cache quantization and Jensen-bias correction for chunk-wise autoregressive video diffusion."""

__version__ = "0.1.0"
