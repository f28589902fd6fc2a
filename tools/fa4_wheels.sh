#!/usr/bin/env bash
# Builds the two carry folders tools/fa4_setup.sh installs from, on a machine with pip access
# (~100 MB download, ~2 min of xz on 2 cores): the lent GPU box has no network and takes at most
# 64 MiB a call, and CUTLASS's CuTe-DSL compiler library is 193 MB (92 MB as a wheel).
#   .fa4a/ir.so.xz   the compiler library, xz (52 MB): a first call copies it to /tmp/fa4a
#   .fa4b/           every other wheel, the cu13 libs wheel without its two large libraries
#                    (libs_cu13_rest.tgz) and the runtime library, xz (rt.so.xz): ~23 MB
# Both folders are git-ignored. For Python 3.12 x86-64 (the GPU box's); the versions are the
# ones measured (kernels/BENCHMARKS.md, 2026-12-03).
set -e
cd "$(dirname "$0")/.."
W=$(mktemp -d)
pip3() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W" "$@"; }
pip3 flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
rm -rf .fa4a .fa4b && mkdir -p .fa4a .fa4b "$W/libs"
(cd "$W/libs" && unzip -q "$W"/nvidia_cutlass_dsl_libs_cu13-*.whl)
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RT=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
xz -T0 -6 -c "$W/libs/$IR" > .fa4a/ir.so.xz
xz -T0 -6 -c "$W/libs/$RT" > .fa4b/rt.so.xz
rm "$W/libs/$IR" "$W/libs/$RT"
tar czf .fa4b/libs_cu13_rest.tgz -C "$W/libs" .
rm "$W"/nvidia_cutlass_dsl_libs_cu13-*.whl
mv "$W"/*.whl .fa4b/
rm -rf "$W"
du -sh .fa4a .fa4b
