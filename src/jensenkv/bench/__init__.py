"""Performance benchmarks behind `make bench` (scripts/bench.py -> results/bench.{csv,md}).

- timing: interleaved, paired repetitions (median and IQR of per-repetition ratios)
- presets: cache settings composed from configs/quant/*.yaml, so a label means what a run means
- memory: held memory of a multi-layer cache and the peak memory of a whole generation, each measured
  in a fresh process (RSS with a fixed malloc mmap threshold, and live tensor bytes)
- subjects: the built-in model and a long-context random SkyReels-V2 configuration
- suite: runs the benchmarks and writes the report; plan: the benchmarks' names, the Plan and the row;
  memory_rows / timing_rows: the benchmarks themselves; suite_report: bench.csv and bench.md
- gpu_check (`make gpu-check`): its groups in gpu_checks (GROUPS), one module per group (gpu_check_*)
"""
