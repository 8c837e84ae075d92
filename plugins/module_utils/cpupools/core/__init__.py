"""Floor 0, core: the vocabulary every other floor speaks.

The error classes (with the variable each refusal names), cpulists and
cpumasks in every notation the kernel and CMK use, CMK's pool names and the
runtimes' names, Kubernetes' rules for names (kube_names), replacing a file
whole (files), the digest of a JSON value that the node and the controller
both name things by (digest), and the bytecode cache of a module's payload.
Imports nothing of cpupools outside itself.
"""
