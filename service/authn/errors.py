"""The HTTP-free error tree of AuthN; each class carries a stable snake_case ``code``.

::

    AuthnError                       authn_error
    ├── Unauthenticated              unauthenticated       (or the presented token's code)
    ├── InvalidCredentials           invalid_credentials   (login: one answer for every failure)
    ├── Throttled                    throttled             (retry_after_s)
    ├── InvalidToken                 invalid_token
    │   ├── TokenTooLarge            token_too_large
    │   ├── TokenMalformed           token_malformed       (framing, base64url, JSON, dup keys)
    │   ├── TokenHeaderInvalid       token_header_invalid  (not alg/typ/kid: jwk, jku, crit...)
    │   ├── AlgorithmNotAllowed      token_alg_not_allowed
    │   ├── TokenTypeMismatch        token_type_mismatch   (one token kind presented as another)
    │   ├── UnknownKey               token_unknown_kid
    │   ├── SignatureInvalid         token_signature_invalid
    │   ├── ClaimsInvalid            token_claims_invalid  (missing, mistyped or over-long claims)
    │   ├── IssuerMismatch           token_issuer_mismatch
    │   ├── AudienceMismatch         token_audience_mismatch
    │   ├── TokenExpired             token_expired
    │   ├── TokenNotYetValid         token_not_yet_valid
    │   ├── TokenReplayed            token_replayed
    │   ├── SessionRevoked           session_revoked
    │   ├── SessionInactive          session_inactive      (unknown or expired session)
    │   └── SubjectDisabled          subject_disabled
    ├── OtpInvalid                   otp_invalid           (wrong or already used)
    ├── StepUpUnavailable            step_up_not_available (services, agents, humans without TOTP)
    └── StepUpRequired               insufficient_user_authentication (RFC 9470; challenge)

Messages are fixed per class and safe to show; they never name a subject, a key or a token.
"""

from __future__ import annotations


class AuthnError(Exception):
    """Base of every AuthN failure."""

    code = "authn_error"
    message = "authentication failed"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.message)


class Unauthenticated(AuthnError):
    """A protected action was asked for without a valid identity; ``code`` is the presented
    token's error code when there was one (``token_expired``, ...), else ``unauthenticated``."""

    code = "unauthenticated"
    message = "valid credentials are required"

    def __init__(self, code: str | None = None) -> None:
        super().__init__()
        if code:
            self.code = code


class InvalidCredentials(AuthnError):
    """Unknown subject, wrong password, disabled identity, bad assertion: one answer for all.

    ``reason`` names the internal cause for audit records and logs; it must never reach the client.
    """

    code = "invalid_credentials"
    message = "invalid credentials"

    def __init__(self, reason: str = "invalid_credentials") -> None:
        super().__init__()
        self.reason = reason


class Throttled(AuthnError):
    code = "throttled"
    message = "too many failed attempts; try again later"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__()
        self.retry_after_s = retry_after_s


class InvalidToken(AuthnError):
    """A bearer token or assertion that must not be accepted (RFC 6750 ``invalid_token``)."""

    code = "invalid_token"
    message = "the token is invalid"


class TokenTooLarge(InvalidToken):
    code = "token_too_large"
    message = "the token is too large"


class TokenMalformed(InvalidToken):
    code = "token_malformed"
    message = "the token is malformed"


class TokenHeaderInvalid(InvalidToken):
    code = "token_header_invalid"
    message = "the token header is not acceptable"


class AlgorithmNotAllowed(InvalidToken):
    code = "token_alg_not_allowed"
    message = "the token algorithm is not allowed"


class TokenTypeMismatch(InvalidToken):
    code = "token_type_mismatch"
    message = "the token is not of the expected type"


class UnknownKey(InvalidToken):
    code = "token_unknown_kid"
    message = "the token was signed by an unknown key"


class SignatureInvalid(InvalidToken):
    code = "token_signature_invalid"
    message = "the token signature is invalid"


class ClaimsInvalid(InvalidToken):
    code = "token_claims_invalid"
    message = "the token claims are invalid"


class IssuerMismatch(InvalidToken):
    code = "token_issuer_mismatch"
    message = "the token issuer is not accepted"


class AudienceMismatch(InvalidToken):
    code = "token_audience_mismatch"
    message = "the token audience is not accepted"


class TokenExpired(InvalidToken):
    code = "token_expired"
    message = "the token has expired"


class TokenNotYetValid(InvalidToken):
    code = "token_not_yet_valid"
    message = "the token is not valid yet"


class TokenReplayed(InvalidToken):
    code = "token_replayed"
    message = "the token was already used"


class SessionRevoked(InvalidToken):
    code = "session_revoked"
    message = "the session has been revoked"


class SessionInactive(InvalidToken):
    code = "session_inactive"
    message = "the session is not active"


class SubjectDisabled(InvalidToken):
    code = "subject_disabled"
    message = "the subject can no longer authenticate"


class OtpInvalid(AuthnError):
    code = "otp_invalid"
    message = "the one-time code is invalid"


class StepUpUnavailable(AuthnError):
    code = "step_up_not_available"
    message = "this principal cannot step up"


class StepUpRequired(AuthnError):
    """RFC 9470: a fresher authentication is needed; ``challenge`` is the header value."""

    code = "insufficient_user_authentication"
    message = "a recent step-up authentication is required"

    def __init__(self, challenge: str, message: str | None = None) -> None:
        super().__init__()
        self.challenge = challenge
        if message is not None:
            self.message = message
