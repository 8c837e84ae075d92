"""cpupools: the logic shared by the Ansible modules and the node agent, in layers.

Standard library only, no Ansible imports: everything here also runs on the
managed node's python3, inside a module's payload or the ``cmk`` agent. Each
sub-package imports only from itself and from floors below it, as its own
``__init__`` says (checked by tests/test_layers.py; the README draws
the diagram)::

    5  agent                      the cmk node agent (isolate, reconcile, describe);
                                  not planning, not report
    4  cluster     report         the API server's side; the fleet report
    3  planning    verify         the inputs, the plan, the runtimes' renderings;
                                  is the running node quiet (read, judged, measured)
    2  node                       what is written on a node and read back from it
    1  hardware                   the CPUs the kernel shows: topology, NUMA distances
    0  core                       errors, cpulists, names (pools, runtimes, Kubernetes')

Every sub-package's ``__init__`` imports nothing: importing one module loads
only what it imports (the agent's zipapp is that closure). This file imports
one module, and only inside a module's payload from Ansible (a zip of sources
under ``ansible_collections``): the bytecode cache of core/bytecode.py, so
that a module run does not compile the package's sources again; it compiles
that one itself, once.
"""

if __name__.startswith("ansible_collections.") and type(globals().get("__loader__")).__name__ == "zipimporter":
    # Compiled here once: zipimport would compile it twice (core/bytecode.py says why), and it is
    # the one module the cache cannot serve. It imports nothing of the package. The import statement
    # that never runs is what puts the file in the payload: Ansible's builder reads import statements.
    if False:  # pylint: disable=using-constant-test
        from .core import bytecode  # noqa: F401
    import sys as _sys
    import types as _types

    _origin = __path__[0] + "/core/bytecode.py"
    _bytecode = _types.ModuleType(__name__ + ".core.bytecode")
    _bytecode.__file__ = _origin
    _bytecode.__loader__ = __loader__
    _sys.modules[_bytecode.__name__] = _bytecode
    exec(compile(__loader__.get_data(_origin), _origin, "exec", dont_inherit=True), _bytecode.__dict__)
    _bytecode.install(__name__)
