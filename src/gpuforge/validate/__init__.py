"""Validation of GPU nodes and fabrics: parsers for real tool output, and checks built on them.

``gpuforge.validate.parsers`` turns the text that ``nvidia-smi``, ``dcgmi``, nccl-tests, ``ibstat``,
perftest, gpu-burn and the kernel log print into frozen, typed results.
"""
