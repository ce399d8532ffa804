"""Tests of the compose preflight: normalizer, rules, report, schema, CLI, examples, corpus."""
