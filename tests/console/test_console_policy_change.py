"""Issue 30 (2): the console's page of a policy-change ticket shows what is asked to approve:
the signed message and author, the vetting, the diff (its text too) against the running
revision, and the replayed impact; nothing of it renders as markup."""

from __future__ import annotations

from service.authz.revisions import Bundle
from tests.auth import bearer, login, step_up
from tests.authz.revisions import keypair, published, store_keys
from tests.console.console import Visitor
from tests.problems import assert_problem
from tests.servers import REPO


async def test_the_ticket_page_renders_the_policy_change_with_its_diff(make_client, tmp_path):
    key, public = keypair(tmp_path)
    client = await make_client({"policies": {"store": store_keys(public)}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    base = Bundle.from_dir(REPO / "policies")
    hostile = "<script>alert(1)</script>"
    bundle = Bundle({**base.modules, "authz.rego": base.modules["authz.rego"]
                     + f"\n# reviewed change {hostile}\n"}, base.data)
    body = published(key, bundle, f"tighten reads {hostile}")
    await assert_problem(await client.post("/api/v1/policy/revisions", json=body,
                                           headers=bearer(alice)), 403, "approval_required")
    r = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "policy.publish",
        "resource": {"revision": bundle.revision_id(), "digest": bundle.digest}})
    assert r.status == 201, await r.text()
    ticket = await r.json()

    bob = Visitor(client)
    try:
        assert (await bob.sign_in("bob")).status == 303
        page = await bob.page(f"/console/tickets/{ticket['id']}")
    finally:
        await bob.close()
    assert 'id="policy-change"' in page and "The policy change" in page
    assert f"<code>{bundle.revision_id()}</code> (proposed)" in page
    assert "tighten reads &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)</script>" not in page
    assert "1 files, +2 -0 lines" in page and "<code>authz.rego</code>" in page
    assert "+# reviewed change &lt;script&gt;" in page  # the diff text itself
    assert "passed" in page and "no decision log is configured" in page
