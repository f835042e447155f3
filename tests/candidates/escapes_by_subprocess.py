"""Attack: a new program (no audit hook in it) writes a file outside the work dir, reads
the parent's environment through /proc and tries the network; what it got goes into an
exception message. Set PIKE_TEST_TARGET to the file to write."""

import os
import subprocess

import torch.nn as nn

SCRIPT = r"""
import os, socket, sys
got = []
target = os.environ.get("PIKE_TEST_TARGET", "/tmp/pike-escape-test")
try:
    open(target, "w").write("escaped")
    got.append("wrote " + target)
except OSError as err:
    got.append("write refused: %s" % err.strerror)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            env = open("/proc/%s/environ" % pid, "rb").read()
            if b"CANARY" in env:
                got.append("environ: " + env.decode(errors="replace"))
        except OSError:
            pass
try:
    socket.create_connection(("127.0.0.1", int(os.environ.get("PIKE_TEST_PORT", "9"))), 1)
    got.append("network reached")
except OSError as err:
    got.append("network refused")
try:
    os.link("/etc/hostname", os.path.join(os.getcwd(), "hostname-link"))
    got.append("hard link made")
except OSError:
    got.append("link refused")
print(" | ".join(got))
"""


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        done = subprocess.run(["python3", "-c", SCRIPT], capture_output=True, text=True,
                              env={**os.environ})
        raise RuntimeError("escape report: " + done.stdout + done.stderr[-300:])
