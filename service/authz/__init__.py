"""Serving: what decides requests and keeps the revision that decides them current.

It never imports ``service.policytools`` (the authoring and review tools, which import it);
``tests/test_layers_authz.py`` checks every import. Each module and why it is here:

- ``actions``: the action catalogue every decision is about.
- ``decision``: the decision type the chain and the log carry.
- ``input``: builds, validates and strips the input document of each request.
- ``projection``: the policy data as the engine serves it (tables projected per request).
- ``engine``: compiles, vets and swaps revisions, and decides.
- ``decide``: the chain's AuthZ stage.
- ``inputrefs``: the decision cache key (which input paths a revision reads).
- ``regolex``: the one Rego lexer; the cache key reads it, so it lives where the key does.
- ``regotest``: the test runner: the engine vets every revision by running its tests first.
- ``regosrc``: reads Rego structure for the runner (``with input`` rewriting, explanations).
- ``source``: a revision's modules and data, as read from a directory.
- ``revisions``, ``activations``: signed revisions and which one the fleet runs.
- ``reload``: follows the files or the store and swaps the revision in.
- ``decisionlog``: the decision log written on every decision.
- ``shadow``, ``shadowproc``: a candidate deciding beside the live revision, off the request path.
"""
