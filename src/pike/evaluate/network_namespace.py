"""Cutting an evaluation child off the network where there is no OS sandbox: its own
network namespace (`unshare --net`), where the kernel lets an unprivileged user make one.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess

from pike.errors import EvaluatorError

log = logging.getLogger(__name__)


@functools.cache
def _namespace_works() -> bool:
    """Can this user create a network namespace (unprivileged user namespaces)?"""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, "--net", "--map-root-user", "true"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def network_prefix(mode: str) -> list[str]:
    """The command prefix that cuts a child off the network, per EvalConfig.network_isolation."""
    if mode == "off":
        return []
    if _namespace_works():
        return [str(shutil.which("unshare")), "--net", "--map-root-user"]
    if mode == "namespace":
        raise EvaluatorError("network_isolation is 'namespace' but this kernel does not allow "
                             "unprivileged network namespaces (`unshare --net --map-root-user`)")
    _warn_once()
    return []


@functools.cache
def _warn_once() -> None:
    log.warning("cannot create a network namespace here; candidates' network access is refused "
                "only by the in-process audit hook")


def network_isolation(mode: str) -> str:
    if mode == "off":
        return "not isolated (network_isolation: off); the audit hook still refuses sockets"
    if _namespace_works():
        return "own network namespace with no interfaces"
    return "no namespace available here; the audit hook refuses sockets"
