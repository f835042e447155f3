"""`pike audit`: re-judge a folder of solutions (someone's claimed speedups, or a pike
solution set) under the strict evaluator, with aggregates that never hide a failure."""

from pike.audit.markdown import to_markdown
from pike.audit.matching import match_solutions
from pike.audit.precision import detect_precision
from pike.audit.result import Aggregates, AuditResult, ModeGeomean, TaskAudit, TrialError
from pike.audit.run import audit
from pike.audit.run import resume as resume_audit

__all__ = [
    "Aggregates", "AuditResult", "ModeGeomean", "TaskAudit", "TrialError", "audit",
    "detect_precision", "match_solutions", "resume_audit", "to_markdown",
]
