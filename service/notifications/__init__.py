"""Approval notifications: the outbox dispatcher and the sinks it delivers to.

    signing.py     Standard Webhooks signatures (whsec_ secrets, v1 HMAC-SHA256)
    envelope.py    what a sink sends: the CloudEvents 1.0 envelope, the Slack message
    reviewers.py   who may review a requested ticket (the review endpoint's rules)
    sinks.py       webhook and Slack-compatible delivery over HTTP (timeouts, no redirects)
    dispatcher.py  claims due outbox events under a lease, delivers, retries, dead-letters
"""
