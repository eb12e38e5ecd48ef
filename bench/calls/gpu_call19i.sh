#!/usr/bin/env bash
# One device call (nineteenth session): GPU tests of the dense model's packed attention after
# dense_packed_attention moved to nsa_jax/dense_packed.py (run as this one command line).
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; PYTHONPATH=. timeout 300 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py tests/test_documents.py tests/test_packed.py -k "dense or packed" 2>&1 | tail -6
