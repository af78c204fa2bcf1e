"""Performance benchmarks behind `make bench` (scripts/bench.py): timing helpers, one module per benchmark.

- timing: interleaved repetitions, medians, paired ratios
- cache_bytes: measured bytes per cached token vs BF16 and vs theory
- quantize_throughput: quantize-on-commit speed
- attention_overhead: cost of the Jensen correction on the CPU attention path
- end_to_end / tiny_e2e: generation time of the built-in model per cache configuration
- gpu: the flex path on CUDA (skipped without a GPU)
- suite: what `make bench` runs; report: bench.csv / bench.md
"""
