"""cpupools: the pure logic shared by the Ansible modules and the node agent.

Standard library only, no Ansible imports: everything here also runs inside
the ``cmk`` node agent on the managed node's python3.
"""
