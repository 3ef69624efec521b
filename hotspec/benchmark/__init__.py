"""Benchmark harness behind `hotspec bench`: speculative vs vanilla decoding on a prompt file,
with a transformers `generate` baseline (also used by benchmarks/decode_bench.py)."""
