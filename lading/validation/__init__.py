"""
Validation of extracted results: is this result good enough to deliver unreviewed?

`validate(result, source_text=..., policy=...)` returns a `Verdict`; the executor moves a
passed job to SUCCEEDED and a failed one to REVIEW_REQUIRED with the verdict attached.
Policies are in `policies`, their checks in `checks`, the verdict types in `verdicts`.
"""

from lading.validation.policies import DEFAULT_POLICY, STRICT_V1, STRICT_V2, known_policies, validate
from lading.validation.verdicts import FailedCheck, Verdict

__all__ = ["DEFAULT_POLICY", "STRICT_V1", "STRICT_V2", "FailedCheck", "Verdict", "known_policies", "validate"]
