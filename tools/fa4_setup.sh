#!/usr/bin/env bash
# Installs the optional flash-attn-4 package (FlashAttention-4's CuTe kernels) and its
# dependencies on a GPU box without network, from wheels carried in two parts (the lent
# machine takes at most 64 MiB a call, and CUTLASS's CuTe DSL compiler library alone is 92 MB
# as a wheel): `.fa4a/ir.so.xz` (the compiler library, xz) sent by a first call and copied to
# /tmp/fa4a, then `.fa4b/` (the other wheels, the cu13 libs wheel without its two large
# libraries, the runtime library, xz) with the call that runs this. Installs into /tmp/site;
# the caller then exports
#   PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
# (the second path is what the nvidia-cutlass-dsl wheel's .pth would add in a site dir).
# tools/fa4_wheels.sh builds both folders. A machine with pip access needs none of this:
# `pip install flash-attn-4==4.0.0b36 'nvidia-cutlass-dsl[cu13]'` (or `pip install ./kernels[flash4]`).
set -e
S=/tmp/site
A=${FA4A:-/tmp/fa4a}
[ -f "$S/.fa4_ok" ] && exit 0  # (a warm machine keeps /tmp)
[ -f "$A/ir.so.xz" ] || [ -f .fa4a/ir.so.xz ] || { echo "fa4_setup: no ir.so.xz in $A or .fa4a" >&2; exit 2; }
[ -f "$A/ir.so.xz" ] || A=.fa4a
mkdir -p "$S"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .fa4b/*.whl
tar xzf .fa4b/libs_cu13_rest.tgz -C "$S"
xz -dc "$A/ir.so.xz" > "$S/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so"
xz -dc .fa4b/rt.so.xz > "$S/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so"
chmod +x "$S"/nvidia_cutlass_dsl/cu13/lib/*.so "$S"/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/*.so
touch "$S/.fa4_ok"
