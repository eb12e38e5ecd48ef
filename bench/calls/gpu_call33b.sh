#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): the bench-shape peers table at 64k on an H200, our kernels and the
# public ones in one process (bench/calls/gpu_call29f.sh: exits at once on any card other than an H200). Carry .whl
# (fla_core-0.6.0-py3-none-any.whl) and .peers/xunhao (XunhaoLai/native-sparse-attention-triton at 9bea856).
#   bash bench/calls/gpu_call33b.sh
exec bash bench/calls/gpu_call29f.sh
