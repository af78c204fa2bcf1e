"""Where `make reproduce-table1`'s time goes, phase by phase, from a py-spy profile of the whole command.

    .venv/bin/py-spy record -r 10 --subprocesses --nonblocking -f raw -o table1.raw -- make reproduce-table1
    .venv/bin/python scripts/table1_phases.py table1.raw [--rate 10]

--nonblocking matters: py-spy otherwise stops every thread of a process to sample it, and a worker that starts
ffmpeg (an mp4) then hangs in exec, waiting for threads py-spy holds stopped.

Each sample of every process (the sweep's workers included) is assigned to the first phase whose pattern its
stack matches. A phase's seconds are its samples over the rate: process time while the interpreter was busy,
summed over processes (two workers on two cores make up to twice the wall time). Native threads are not
sampled: torch's intra-op threads count through the Python frame that called them.
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

PHASES = (  # (phase, pattern on the collapsed stack); the first match wins, so the order matters
    ("noise floor", r"jensenkv\.run\.noise_floor|run/noise_floor\.py"),
    ("calibration fit", r"jensenkv\.calibration|calibration/fit\.py"),
    ("reports and sample frames", r"jensenkv/report/|sample_frames\.py|jensenkv\.report"),
    ("teacher-forced", r"teacher_forced"),
    ("mp4 writing and the 256 px copies", r"save_mp4|save_upscaled|video_files\.py"),
    ("VBench", r"eval/vbench\.py|vbench/"),
    ("LPIPS", r"[Ll]pips"),
    ("SSIM", r"video_ssim|Ssim"),
    ("PSNR", r"video_psnr|Psnr"),
    ("probes (inside generation)", r"attention/probes\.py"),
    ("BF16 references", r"references \(jensenkv/run/videos\.py"),
    ("generation", r"generate \(jensenkv/run/videos\.py"),
    ("record and store", r"jensenkv/store/|assemble|score_run|video_result|prompt_done"),
    ("imports", r"_find_and_load"),
    ("hydra, launcher, config", r"hydra|joblib|omegaconf|jensenkv/config/"),
)


def recipe_command(stack: str) -> str:
    """The make recipe line a sample belongs to: the command of the innermost shell in its process ancestry
    (``bash -c <line>``: reproduce-table1's runs go through a second make, whose own line is the outer shell),
    else the sampled process's own command line."""
    commands = re.findall(r'process \d+:"([^"]*)"', stack)
    for command in reversed(commands):
        if re.match(r"\S*\b(ba)?sh -c ", command):
            return command.split(" -c ", 1)[1][:120]
    return commands[-1][:120] if commands else "?"


def phase_seconds(lines, rate: float) -> tuple[collections.Counter, collections.Counter]:
    """(seconds per phase, seconds per recipe line) of py-spy raw lines ("frame;frame;... count"; with
    --subprocesses each stack starts with its process ancestry, 'process <pid>:"<command line>"' frames)."""
    phases, processes = collections.Counter(), collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        name = next((phase for phase, pattern in PHASES if re.search(pattern, stack)), "other")
        phases[name] += int(count) / rate
        processes[recipe_command(stack)] += int(count) / rate
    return phases, processes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="py-spy record -f raw output")
    parser.add_argument("--rate", type=float, default=10.0, help="py-spy's -r (samples per second)")
    args = parser.parse_args(argv)
    phases, processes = phase_seconds(args.profile.read_text().splitlines(), args.rate)
    total = sum(phases.values())
    print("| phase | process s | share |\n|---|---:|---:|")
    for name, seconds in phases.most_common():
        print(f"| {name} | {seconds:.0f} | {100 * seconds / total:.1f}% |")
    print(f"| all | {total:.0f} | 100% |\n\nby command:")
    for command, seconds in processes.most_common(15):
        print(f"{seconds:8.0f} s  {command}")


if __name__ == "__main__":
    main()
