"""Measurements, no UI: side-by-side runs, lockstep KLD / top-1 / ΔNLL, quality, sweeps, needle, inspect, memory,
latency, and the peers measured beside the tiers (transformers' QuantizedCache, llama.cpp).

Each module returns data (dataclasses, rows); the figures, the app and the CLI present it.
"""
