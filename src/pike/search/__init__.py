"""Search strategies: what to ask next, within the budget. PIKE-B lives in branching.py."""

from pike.search.session import OptimizeResult, optimize

__all__ = ["OptimizeResult", "optimize"]
