"""gramcheck: property tests, error bounds and stability certificates for linear and kernelized attention.

Public API: ``check`` (run the property catalogue against an attention function, returns a ``Report``),
``certify`` (the same, as a ``Certificate``), ``verify`` (re-run a certificate file), ``Finding``,
the variant ``registry`` (``gramcheck.variants``), the bounds (``gramcheck.bounds``), the Hypothesis
strategies (``gramcheck.strategies``) and spectra (``gramcheck.spectra``).
"""

from __future__ import annotations

from . import variants
from . import variants as registry
from .api import certify, check, verify
from .certificate import Certificate, CertificateError
from .findings import Finding
from .precision import gamma, unit_roundoff
from .report import PropertyFailure, Report
from .search import Domain

__version__ = "0.1.0"

__all__ = [
    "Certificate",
    "CertificateError",
    "Domain",
    "Finding",
    "PropertyFailure",
    "Report",
    "__version__",
    "certify",
    "check",
    "gamma",
    "registry",
    "unit_roundoff",
    "variants",
    "verify",
]
