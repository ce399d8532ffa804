"""Policy tools: what authors and reviewers run on policies, never on the decision path.

Serving (``service.authz``) never imports this package (``tests/test_layers_authz.py``); this
package imports serving freely. Each module and why it is here:

- ``lint``: static checks and a child-process compile for ``cpctl policy lint``; nothing serves from it.
- ``coverage``: instruments modules to measure which clauses tests exercise; authoring only.
- ``cases``: the decision-case files (``examples/decisions``) the CLI, replay and pytest load.
- ``replay``: re-decides recorded decisions against a candidate, to judge a change.
- ``change``: the reviewers' impact report of a policy change (a diff plus a replay).

Kept in serving, for a reason: ``regotest`` (the engine vets every revision by running its own
tests before serving it), ``regosrc`` (the test runner's ``with input`` rewriting and failure
explanations read it), ``inputrefs`` (the decision cache key) and ``regolex`` (the one lexer,
which the key reads).
"""
