"""The low layer every kernel source is built on, shared by the hand-written template families
(forge_tui/templates) and the code generator (forge_tui/codegen), which import neither each
other's internals nor anything above this layer for it:

device.py   the GPU the sources are for (DeviceProps, DEFAULT_DEVICE, detect_device)
family.py   what a family of kernels is (Family, Match) and the header a candidate carries
source.py   kernel files (.cu, .cuh, .h, .cpp) and their one substitution rule
common.py   the code every candidate starts with (cuda_common.cuh, cpu_common.h, helpers)
launch.py   host code the CUDA candidates share (launch.cu)
"""
