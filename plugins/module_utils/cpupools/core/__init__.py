"""Floor 0, core: the vocabulary every other floor speaks.

The error classes (with the variable each refusal names), cpulists and
cpumasks in every notation the kernel and CMK use, and CMK's pool names.
Imports nothing of cpupools outside itself.
"""
