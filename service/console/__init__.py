"""The web console for approvers and requesters (``/console/``): server-rendered pages, one
small script, a cookie session bound to the store session, CSRF on every form, a strict CSP.

``views`` has the routes and ``setup_console``; ``service.consolesession`` the cookie and CSRF
token (the authn middleware identifies console requests by it); ``pages``
the HTML; ``queries`` what the pages read from the store."""
