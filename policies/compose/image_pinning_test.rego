package controlplane.compose.tests.image_pinning

import rego.v1

import data.controlplane.compose.rules.image_pinning as rule

test_built_locally_has_nothing_to_pin if {
	rule.local({"build": {"context": "."}, "image": "app"})
	rule.local({"build": {"context": "."}})
	not rule.local({"image": "nginx:1.27"})
}

test_problems if {
	rule.problem("nginx") == "has no tag (implies :latest)"
	rule.problem("nginx:latest") == "uses the mutable :latest tag"
	rule.problem("localhost:5000/app") == "has no tag (implies :latest)"
	not rule.problem("nginx:1.27")
	not rule.problem("nginx@sha256:abc")
}
