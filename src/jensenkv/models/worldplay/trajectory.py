"""HY-WorldPlay's camera input: per-latent-frame cameras and discrete action labels (docs/WORLDPLAY.md).

A trajectory is given as one of
* a preset name: ``forward``, ``turn`` or ``orbit`` (``preset_motions``);
* a pose string in WorldPlay's own syntax, e.g. ``"w-15, right-16"`` (command-latents, comma-separated:
  w / s forward / back 0.08 per latent frame, a / d left / right 0.08, up / down / left / right 3 degrees
  pitch / yaw per latent frame; ``w-31`` is 31 moves, so 32 latent frames);
* a JSON file (``*.json``), WorldPlay's pose format: ``{"0": {"extrinsic": 4x4 camera-to-world,
  "K": 3x3 pixel intrinsics}, "1": ...}``, one entry per latent frame, keys 0..n-1.

From the camera-to-world poses WorldPlay derives (``hyvideo/generate.py`` ``pose_to_input``, ported here):
world-to-camera matrices (their inverse), intrinsics normalised to fx / (2 cx), fy / (2 cy) with the principal
point at 0.5, and one action label per latent frame: translation class x 9 + rotation class (81 classes),
from the relative pose of each frame to the one before (frame 0: label 0).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from jensenkv.checks import fail

PRESETS = ("forward", "turn", "orbit")
MOVE_SPEED = 0.08                 # WorldPlay's pose strings: units per latent frame
TURN_SPEED = math.radians(3.0)    # radians per latent frame
# WorldPlay's default pixel intrinsics (generate_custom_trajectory.py): a 1920 x 1080 camera
DEFAULT_K = ((969.6969696969696, 0.0, 960.0), (0.0, 969.6969696969696, 540.0), (0.0, 0.0, 1.0))
MOVE_THRESHOLD = 1e-4             # a relative translation shorter than this is no move
ANGLE_THRESHOLD_DEG = 5e-2        # a relative rotation smaller than this (degrees) is no turn
# one-hot (forward, backward, right, left) or (yaw right, yaw left, pitch up, pitch down) -> class (generate.py)
ONE_HOT_CLASSES = {(0, 0, 0, 0): 0, (1, 0, 0, 0): 1, (0, 1, 0, 0): 2, (0, 0, 1, 0): 3, (0, 0, 0, 1): 4,
                   (1, 0, 1, 0): 5, (1, 0, 0, 1): 6, (0, 1, 1, 0): 7, (0, 1, 0, 1): 8}
NUM_ACTIONS = 81


@dataclass(frozen=True)
class Trajectory:
    """Cameras and actions of n latent frames (float64 on CPU; the adapter casts them for the model)."""

    w2c: torch.Tensor          # (n, 4, 4) world-to-camera
    intrinsics: torch.Tensor   # (n, 3, 3) normalised: fx / (2 cx), fy / (2 cy), principal point 0.5
    actions: torch.Tensor      # (n,) int64 labels in [0, 81)

    def __len__(self) -> int:
        return int(self.w2c.shape[0])

    def first(self, frames: int) -> Trajectory:
        """The first ``frames`` latent frames."""
        return Trajectory(self.w2c[:frames], self.intrinsics[:frames], self.actions[:frames])


# --- motions -> camera-to-world poses (WorldPlay's generate_camera_trajectory_local) -------------------------
def _rot_x(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[1.0, 0, 0], [0, c, -s], [0, s, c]])


def _rot_y(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, 0, s], [0, 1.0, 0], [-s, 0, c]])


def poses_from_motions(motions: list[dict[str, float]]) -> np.ndarray:
    """(len(motions) + 1, 4, 4) camera-to-world poses from the identity: each motion turns (yaw, then pitch) in
    the camera's frame, then moves ``forward`` along its z and ``right`` along its x."""
    pose = np.eye(4)
    poses = [pose.copy()]
    for move in motions:
        if "yaw" in move:
            pose[:3, :3] = pose[:3, :3] @ _rot_y(move["yaw"])
        if "pitch" in move:
            pose[:3, :3] = pose[:3, :3] @ _rot_x(move["pitch"])
        if move.get("forward", 0.0):
            pose[:3, 3] += pose[:3, :3] @ np.array([0.0, 0.0, move["forward"]])
        if move.get("right", 0.0):
            pose[:3, 3] += pose[:3, :3] @ np.array([move["right"], 0.0, 0.0])
        poses.append(pose.copy())
    return np.stack(poses)


POSE_COMMANDS = {"w": ("forward", MOVE_SPEED), "s": ("forward", -MOVE_SPEED), "a": ("right", -MOVE_SPEED),
                 "d": ("right", MOVE_SPEED), "up": ("pitch", TURN_SPEED), "down": ("pitch", -TURN_SPEED),
                 "left": ("yaw", -TURN_SPEED), "right": ("yaw", TURN_SPEED)}


def parse_pose_string(text: str, key: str = "generation.worldplay.trajectory") -> list[dict[str, float]]:
    """WorldPlay's pose string, e.g. "w-3, right-0.5, d-4": command-latents (the count truncated to an int)."""
    motions: list[dict[str, float]] = []
    for command in (c.strip() for c in text.split(",")):
        if not command:
            continue
        name, _, count = command.partition("-")
        name = name.strip()
        try:
            n = int(float(count))
        except ValueError:
            n = -1
        if name not in POSE_COMMANDS or n < 0:
            fail(key, text, f"command {command!r}: use <command>-<latent frames> with a command in "
                            f"{tuple(POSE_COMMANDS)}, e.g. 'w-15, right-16'")
        field_name, amount = POSE_COMMANDS[name]
        motions.extend({field_name: amount} for _ in range(n))
    return motions


def preset_motions(name: str, frames: int) -> list[dict[str, float]]:
    """The motions of a preset over ``frames`` latent frames: forward (straight ahead), turn (yaw right 3
    degrees per frame), orbit (a full circle about a point 1 unit ahead, facing it, so the last frames see
    what the first saw)."""
    moves = max(frames - 1, 0)
    if name == "forward":
        return [{"forward": MOVE_SPEED}] * moves
    if name == "turn":
        return [{"yaw": TURN_SPEED}] * moves
    if name == "orbit":
        angle = 2 * math.pi / max(moves, 1)
        # turn left by the angle, then move (in the turned frame) along the chord of a radius-1 circle about
        # the point ahead: the camera stays at distance 1 from it, facing it
        return [{"yaw": -angle, "right": math.sin(angle), "forward": math.cos(angle) - 1.0}] * moves
    fail("generation.worldplay.trajectory", name, f"use a preset {PRESETS}, a pose string or a .json file")
    raise AssertionError


# --- poses -> model inputs (WorldPlay's pose_to_input) -----------------------------------------------------
def _one_hot_class(row: np.ndarray) -> int:
    return ONE_HOT_CLASSES[tuple(int(x) for x in row)]


def action_labels(c2w: np.ndarray) -> torch.Tensor:
    """(n,) int64 labels translation x 9 + rotation from (n, 4, 4) camera-to-world poses (frame 0: 0).

    The relative pose of frame i is c2w[i-1]^-1 c2w[i]. Translation: forward / backward when the move's angle
    to the camera's z axis is below 60 / above 120 degrees, right / left likewise for x (moves shorter than
    1e-4 do not count). Rotation: xyz Euler angles (scipy); yaw right / left when y > / < +-0.05 degrees,
    pitch up / down likewise for x.
    """
    from scipy.spatial.transform import Rotation

    n = c2w.shape[0]
    relative = np.zeros_like(c2w)
    relative[0] = c2w[0]
    relative[1:] = np.linalg.inv(c2w[:-1]) @ c2w[1:]
    trans = np.zeros((n, 4), dtype=np.int64)
    rot = np.zeros((n, 4), dtype=np.int64)
    for i in range(1, n):
        move = relative[i, :3, 3]
        norm = np.linalg.norm(move)
        if norm > MOVE_THRESHOLD:
            angles = np.degrees(np.arccos((move / norm).clip(-1.0, 1.0)))  # to the camera's x, y, z axes
            if angles[2] < 60:
                trans[i, 0] = 1
            elif angles[2] > 120:
                trans[i, 1] = 1
            if angles[0] < 60:
                trans[i, 2] = 1
            elif angles[0] > 120:
                trans[i, 3] = 1
        euler = Rotation.from_matrix(relative[i, :3, :3]).as_euler("xyz", degrees=True)
        if euler[1] > ANGLE_THRESHOLD_DEG:
            rot[i, 0] = 1
        elif euler[1] < -ANGLE_THRESHOLD_DEG:
            rot[i, 1] = 1
        if euler[0] > ANGLE_THRESHOLD_DEG:
            rot[i, 2] = 1
        elif euler[0] < -ANGLE_THRESHOLD_DEG:
            rot[i, 3] = 1
    labels = [_one_hot_class(trans[i]) * 9 + _one_hot_class(rot[i]) for i in range(n)]
    return torch.tensor(labels, dtype=torch.int64)


def normalise_intrinsics(k: np.ndarray) -> np.ndarray:
    """(n, 3, 3) pixel intrinsics -> fx / (2 cx), fy / (2 cy), principal point (0.5, 0.5)."""
    out = np.array(k, dtype=np.float64, copy=True)
    out[:, 0, 0] /= out[:, 0, 2] * 2
    out[:, 1, 1] /= out[:, 1, 2] * 2
    out[:, 0, 2] = 0.5
    out[:, 1, 2] = 0.5
    return out


def from_poses(c2w: np.ndarray, k: np.ndarray, key: str = "generation.worldplay.trajectory",
               value: object = None) -> Trajectory:
    """A trajectory from (n, 4, 4) camera-to-world poses and (n, 3, 3) pixel intrinsics (checked first)."""
    c2w, k = np.asarray(c2w, dtype=np.float64), np.asarray(k, dtype=np.float64)
    value = "<poses>" if value is None else value
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4) or k.shape != (c2w.shape[0], 3, 3) or not len(c2w):
        fail(key, value, f"needs n >= 1 4x4 extrinsics and n 3x3 intrinsics, got {c2w.shape} and {k.shape}")
    if not (np.isfinite(c2w).all() and np.isfinite(k).all()):
        fail(key, value, "its extrinsics and intrinsics must be finite numbers")
    for i, pose in enumerate(c2w):
        if np.linalg.matrix_rank(pose) < 4 or not np.isfinite(np.linalg.cond(pose)) or np.linalg.cond(pose) > 1e12:
            fail(key, value, f"the camera matrix (extrinsic) of latent frame {i} is not invertible")
    if (k[:, 0, 2] == 0).any() or (k[:, 1, 2] == 0).any():
        fail(key, value, "every intrinsic matrix needs a non-zero principal point (cx, cy)")
    w2c = np.linalg.inv(c2w)
    return Trajectory(torch.from_numpy(w2c), torch.from_numpy(normalise_intrinsics(k)), action_labels(c2w))


def read_pose_json(path: Path, key: str = "generation.worldplay.trajectory") -> tuple[np.ndarray, np.ndarray]:
    """WorldPlay's pose JSON -> (n, 4, 4) camera-to-world, (n, 3, 3) intrinsics; keys must be "0".."n-1"."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        fail(key, str(path), f"cannot read it as a pose JSON file ({type(e).__name__}: {e})")
    if not isinstance(data, dict) or sorted(data, key=lambda s: int(s) if str(s).isdigit() else -1) \
            != [str(i) for i in range(len(data))]:
        fail(key, str(path), 'needs an object with keys "0".."n-1", each {"extrinsic": 4x4, "K": 3x3}')
    try:
        c2w = np.array([data[str(i)]["extrinsic"] for i in range(len(data))], dtype=np.float64)
        k = np.array([data[str(i)]["K"] for i in range(len(data))], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        fail(key, str(path), f'every frame needs "extrinsic" (4x4) and "K" (3x3) numbers ({type(e).__name__}: {e})')
    return c2w, k


def load_trajectory(spec: str, frames: int, key: str = "generation.worldplay.trajectory") -> Trajectory:
    """The first ``frames`` latent frames of a preset, a pose string or a pose JSON file (ValueError naming
    ``key`` when it has fewer frames, a camera matrix is not invertible or the file is malformed)."""
    if not isinstance(spec, str) or not spec.strip():
        fail(key, spec, f"use a preset {PRESETS}, a pose string such as 'w-15, right-16' or a .json pose file")
    if spec in PRESETS:
        c2w = poses_from_motions(preset_motions(spec, frames))
        k = np.broadcast_to(np.array(DEFAULT_K), (len(c2w), 3, 3))
    elif spec.endswith(".json"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{key}={spec!r}: the pose file {path} does not exist")
        c2w, k = read_pose_json(path, key)
    else:
        c2w = poses_from_motions(parse_pose_string(spec, key))
        k = np.broadcast_to(np.array(DEFAULT_K), (len(c2w), 3, 3))
    if len(c2w) < frames:
        fail(key, spec, f"it has {len(c2w)} latent frames but the video has {frames} "
                        "(generation.num_chunks x frames_per_chunk); give at least that many")
    return from_poses(c2w[:frames], k[:frames], key, spec)


def write_pose_json(path: str | Path, c2w: np.ndarray, k: np.ndarray | None = None) -> Path:
    """Write poses in WorldPlay's JSON format (k: pixel intrinsics, default WorldPlay's 1920 x 1080 camera)."""
    c2w = np.asarray(c2w, dtype=np.float64)
    k = np.broadcast_to(np.array(DEFAULT_K), (len(c2w), 3, 3)) if k is None else np.asarray(k, dtype=np.float64)
    data = {str(i): {"extrinsic": c2w[i].tolist(), "K": k[i].tolist()} for i in range(len(c2w))}
    path = Path(path)
    path.write_text(json.dumps(data, indent=1))
    return path
