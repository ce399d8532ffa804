package controlplane.compose.tests.secret_env

import rego.v1

import data.controlplane.compose.rules.secret_env as rule

test_obvious_non_secrets if {
	every value in ["", "0", "false", "invalid", "changeme", "CHANGE_ME", "changeit", "<PrivateKey>", "'<PRIVKEY>'", "{{ vault_token }}", "your_token_here", "ChooseYourOwnPasswordHere1234", "MyCloudflareApiToken", "MySecureLoginPasswordForWebApp", "xxxxxx", "********", "..."] {
		rule.not_secret(value)
	}

	# Quoted as the list syntax leaves them (KEY="0"): the quote is decoded, since a literal "\""
	# keeps its escape in regopy 1.5 and would be a backslash to the rule.
	every value in ["0", "none"] {
		rule.not_secret(concat("", [_quote, value, _quote]))
	}
}

_quote := base64.decode("Ig==")

test_real_looking_values_are_secrets if {
	every value in ["hunter2hunter2", "nextcloud", "7jFjT4pUyf0YOlQ84LrO6JdLVWpzKEGiEMtdVwBE", "admin", "s3cr3t-value-123"] {
		not rule.not_secret(value)
	}
}

test_password_hashes if {
	rule.password_hash("$2a$14$1l.IozJx7xQRVmlkEQ32OeEEfP5mRxTpbDTCTcXRqn19gXD8YK1pW")
	rule.password_hash("$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA")
	rule.password_hash("$6$rounds=5000$saltsalt$0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP")
	rule.password_hash("{SSHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=")
	not rule.password_hash("hunter2")
	not rule.password_hash("$notahash")
}

test_secret_names if {
	rule.secret_name("POSTGRES_PASSWORD")
	rule.secret_name("api_key")
	rule.secret_name("SENTRY_DSN")
	not rule.secret_name("POSTGRES_PASSWORD_FILE")
	not rule.secret_name("TOKEN_TTL")
	not rule.secret_name("LOG_LEVEL")
}

test_references_are_no_literal if {
	rule.reference("${DB_PASSWORD}")
	rule.reference("$DB_PASSWORD")
	rule.reference("postgres://u:${PW}@h")
	not rule.reference("pa$$word")
	not rule.reference("costs $5")
	not rule.literal("${DB_PASSWORD}")
	rule.literal("${DB_PASSWORD:-hunter2}") == "hunter2"
	rule.literal("plain") == "plain"
}

test_referenced_variable if {
	rule.referenced_variable("${DB_PASSWORD}") == "DB_PASSWORD"
	rule.referenced_variable("$DB_PASSWORD") == "DB_PASSWORD"
	rule.referenced_variable("${DB_PASSWORD:?set it}") == "DB_PASSWORD"
	rule.dotenv_variable("API_TOKEN", null) == "API_TOKEN"
	rule.dotenv_variable("X", "${Y}") == "Y"
}

# The prefilters: a name or value that one of the full patterns matches contains a literal of
# the cheap hint (else the hint would hide it).
test_every_secret_name_pattern_has_a_hint_literal if {
	every pattern in rule.secret_name_patterns {
		regex.match(rule.secret_name_hint, pattern)
	}
}

test_every_value_check_literal_has_a_hint_literal if {
	every check in rule.secret_value_checks {
		regex.match(rule.secret_value_hint, check[0])
	}
}

test_hash_mark if {
	rule.hash_mark("$2a$14$x")
	rule.hash_mark(" {SSHA}x")
	not rule.hash_mark("hunter2")
}
