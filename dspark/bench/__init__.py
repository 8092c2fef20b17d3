"""Research and engine benchmarking on top of the library: llama.cpp as an engine, the load sweep
and its simulator, the device cost model, training speed and memory, ablation and vocabulary
sweeps. Nothing else in `dspark` imports this package (`tests/test_layering.py`); README.md
beside it has one line per module."""
