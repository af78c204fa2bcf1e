"""The frame rates SkyReels-V2's fps embedding knows (read by the config check and the adapter)."""
from __future__ import annotations

# model.fps -> its row of the two-row fps embedding of SkyReels-V2 inject_sample_info checkpoints (diffusers' DF
# pipeline silently gives any fps but 16 the 24 fps row; the suite refuses it instead). Other models ignore fps.
FPS_EMBEDDING_IDS = {16: 0, 24: 1}
