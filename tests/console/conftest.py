"""Fixtures of the console's single sign-on tests, shared with the API's (tests/authn)."""

from tests.authn.openid_provider import browser, ports  # noqa: F401
