"""diffusers' Wan-family transformer classes a checkpoint may name (``models.loaders`` imports them on demand;
the family checks ``model.transformer_class`` against them before any weight is read)."""
TRANSFORMER_CLASS_NAMES = ("SkyReelsV2Transformer3DModel", "WanTransformer3DModel")
