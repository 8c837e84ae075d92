# Copyright: the cpupools authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a run writes on the controller (``cpupools_work_dir``): the cmk build, the report, the demo sandbox.

``auto`` is the collection's own directory when this user may write there
(the checkout: ``build/``, ``reports/`` and ``sandbox/`` beside the code, as
they always were), and otherwise a directory of the user's: an execution
environment or a system-wide install gives a non-root user a read-only
collection. The user's directory is ``$XDG_CACHE_HOME/cpupools`` (default
``~/.cache/cpupools``), or, where no home directory can be written,
``<tmp>/cpupools-<uid>``, which is created private and refused when
another user owns it or may write into it (a build there is copied to the
nodes and run as root).

The filter ``cpupools.cpupools.work_dir`` and the plan play's action both
resolve the value here; the action also creates the directory, before any
stage writes, or refuses the run naming the variable.
"""

import os
import stat
import tempfile

from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.planning.inputs import nearest_existing

#: The collection's directory (the checkout's root, through collections/'s symbolic link).
COLLECTION_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
VARIABLE = "cpupools_work_dir"


def obstacle(path):
    """Why ``path`` cannot be (made) a directory this user writes into, or None.

    A directory that does not exist yet is fine when its nearest existing
    parent is a directory the user may write into (it is created there).
    """
    probe = nearest_existing(path)
    where = "" if probe == path else f" ({probe} is in its way)"
    if not os.path.isdir(probe):
        return f"{path!r} is not a directory{where}"
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == path else f" ({probe} is the nearest existing directory)"
        return f"{path!r} is not writable{where}"
    return None


def private_dir():
    """The last resort: a directory of this user's in the system's temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"cpupools-{os.getuid()}")


def user_dir(environ=None):
    """``$XDG_CACHE_HOME/cpupools`` (``~/.cache/cpupools``) when it can be written, else ``private_dir()``."""
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(cache):
        home = environ.get("HOME") or os.path.expanduser("~")
        cache = os.path.join(home, ".cache") if os.path.isabs(home) else ""
    if cache and obstacle(os.path.join(cache, "cpupools")) is None:
        return os.path.join(cache, "cpupools")
    return private_dir()


def resolve(value, collection_dir=COLLECTION_DIR, environ=None):
    """The directory ``cpupools_work_dir`` names: ``auto`` resolved, anything else as it is."""
    if value not in (None, "", "auto"):
        return str(value)
    if os.access(collection_dir, os.W_OK | os.X_OK):
        return collection_dir
    return user_dir(environ)


def prepare(value, check_mode, collection_dir=COLLECTION_DIR, environ=None):
    """``(path, refusal)``: the work directory, created unless ``check_mode``, or why it cannot be used.

    In check mode nothing is created: the refusal is what the real run would
    say (a file in the way, no permission). A private temporary directory
    that another user owns or may write into is refused.
    """
    path = resolve(value, collection_dir, environ)
    named = "" if value not in (None, "", "auto") else f" (auto: {collection_dir} is not writable)"
    if path == collection_dir:
        named = ""
    problem = obstacle(path)
    if problem:
        return path, f"{VARIABLE}: {problem} on the controller{named}"
    if check_mode and not os.path.isdir(path):
        return path, None
    try:
        os.makedirs(path, mode=0o700 if path == private_dir() else 0o777, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        return path, f"{VARIABLE}: {path!r} cannot be created on the controller: {exc.strerror}{named}"
    if not stat.S_ISDIR(info.st_mode):
        return path, f"{VARIABLE}: {path!r} is not a directory on the controller{named}"
    if path == private_dir() and (info.st_uid != os.getuid() or info.st_mode & 0o022):
        return path, (
            f"{VARIABLE}: {path!r} belongs to uid {info.st_uid} or others may write into it "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); set {VARIABLE} to a directory of your own"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        return path, f"{VARIABLE}: {path!r} is not writable on the controller{named}"
    return path, None
