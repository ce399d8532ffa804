"""AuthN: identity, sessions, short-lived tokens and step-up; derives the ``Principal``.

Framework-free (no aiohttp here). Modules, in the order a request meets them:
``tokens`` (JWS/JWT framing and access tokens), ``keyring`` (signing key ring, JWKS),
``sessions`` (``Authenticator``: logins, bearer checks, step-up, revocation), ``principal``,
``stepup`` (RFC 9470), ``assertions`` (service/agent logins), ``identities``, ``passwords``,
``totp``; every failure is an ``errors.AuthnError`` with a stable ``code``.
Tokens carry no roles, groups or grants (DESIGN §1 rule 2).
"""
