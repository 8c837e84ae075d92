# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's own Jinja filters and tests, loaded once in ansible-playbook's main process.

ansible-core loads the ``ansible.builtin`` filters and tests (every file of
them at once) the first time a process templates a filter or a test. Tasks
run in workers forked from the main process, which templates little itself
(a ``when:`` or a task's arguments are templated in the worker). So each
worker of a task whose arguments, conditions or host values use a filter
loaded them again: the filter files imported, and ``ansible.utils.encrypt``
looking libcrypt up with ``ctypes.util.find_library``, which runs
``ldconfig -p``. About 20 ms of CPU per task and host on the development
machine, about what ``ansible.builtin.ping``'s whole worker takes
(docs/performance.md, "Filters loaded once").

The strategy imports a task's action in the main process before it forks
the task's workers, so each action of this collection calls ``load`` when it
is imported: the workers forked after it find the plugins loaded. Loading
them is what the first worker would have done; a plugin directory added
later (a role's ``filter_plugins``) clears ansible-core's cache as before,
and the next process that needs them loads them again.

It also builds Ansible's Jinja lexer there (ansible-core 2.19 and later).
Each ``register:`` of a task is an expression that ansible-core 2.21 compiles
in the host's worker after the action ran, and the first compile in a
process builds the lexer of the template environment (some thirty regular
expressions; ansible-core caches it on the environment's class). The main
process of a run whose plays template nothing never builds it, so without
this every worker of a registered task built its own: about 1 ms of CPU per
task and host (docs/performance.md, "A real node's kernel, ansible-core's
warnings and its lexer").
"""

_lexer_built = False


def load():
    """Load the builtin filters and tests in this process; never fails (a worker would load them anyway).

    Once loaded, a second call only looks two names up.
    """
    try:
        from ansible.plugins.loader import filter_loader, test_loader

        filter_loader.get("ansible.builtin.bool")
        test_loader.get("ansible.builtin.success")
    except Exception:  # only an optimisation: a worker loads what it needs, as before
        pass
    global _lexer_built
    if not _lexer_built:
        _lexer_built = True
        try:
            from ansible.template import Templar, trust_as_template  # ansible-core 2.19 and later

            Templar().evaluate_expression(trust_as_template("0"))
        except Exception:  # an older ansible-core, or none of this: a worker builds it, as before
            pass
