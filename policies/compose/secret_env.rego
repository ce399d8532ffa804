package controlplane.compose.rules.secret_env

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "secret-env",
	"title": "Secret in plain environment",
	"severity": "fail",
	"rationale": "Environment values are visible in docker inspect, in /proc/<pid>/environ, in crash dumps and in every child process, and end up in the compose file or CI logs. Passwords, tokens and keys belong in secrets:, mounted as files.",
	"remediation": "Move the value to a Compose secret (top-level secrets: with file: or environment:, then secrets: [name] on the service) and point the application at /run/secrets/<name>, e.g. with a *_FILE variable.",
}

# Variable names that announce a secret (compared upper-case).
secret_name_patterns := [
	`PASSWORD`, `PASSWD`, `PASSPHRASE`, `SECRET`, `TOKEN`, `API_?KEY`, `PRIVATE_?KEY`,
	`ACCESS_?KEY`, `CREDENTIAL`, `AUTH_?KEY`, `ENCRYPTION_?KEY`, `SIGNING_?KEY`, `_PASS$`, `^PASS$`,
	`_PWD$`, `^PWD_`, `DSN$`, `CONNECTION_?STRING`,
]

# Names that only describe a secret (where it is, how long it lives), not hold it.
reference_suffixes := [`_FILE$`, `_PATH$`, `_DIR$`, `_LENGTH$`, `_TTL$`, `_EXPIRY$`, `_EXPIRES?(_IN)?$`, `_ENABLED$`, `_METHOD$`, `_TYPE$`, `_HEADER$`, `_NAME$`]

# Values that look like credentials whatever the name (provider key formats, PEM keys, JWTs,
# URLs with a password): each pattern with a literal every match of it contains. regex.match
# compiles its pattern on every call in regopy, and counted repetitions make that costly (all
# of these in one alternation ~0.5 ms a call): so each pattern is tried alone, and only on a
# value that contains its literal (``contains`` is cheap).
secret_value_checks := [
	["AKIA", `AKIA[0-9A-Z]{16}`],
	["-----BEGIN ", `-----BEGIN [A-Z ]*PRIVATE KEY-----`],
	["gh", `gh[pousr]_[A-Za-z0-9]{36}`],
	["github_pat_", `github_pat_[A-Za-z0-9_]{22,}`],
	["glpat-", `glpat-[A-Za-z0-9_-]{20}`],
	["xox", `xox[abposr]-[A-Za-z0-9-]{10,}`],
	["sk_live_", `sk_live_[0-9A-Za-z]{16,}`],
	["sk-", `sk-[A-Za-z0-9_-]{32,}`],
	["AIza", `AIza[0-9A-Za-z_-]{35}`],
	["eyJ", `eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.`],
	["://", `[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@`],
]

# Values that are clearly not a secret even under a secret-looking name.
harmless_values := {"", "true", "false", "yes", "no", "on", "off", "0", "1", "-1", "none", "null", "nil", "undefined", "unset", "disabled", "invalid", "empty", "changeme_not_used"}

# Placeholders that documentation and example files put where a secret goes ("changeme",
# "<PrivateKey>", "your_token_here", "ChooseYourOwnPasswordHere1234", "xxxx"): not a leaked
# secret (a deploy that keeps one fails at login, or is caught by the service's own check).
placeholder_patterns := [
	`^<[^<>]*>$`, `^\{\{[^{}]*\}\}$`, `^\[[^\[\]]*\]$`,
	`^(please[-_ ]?)?(change|replace|update|set)[-_ ]?(me|it|this)`,
	`^(your|my|choose|enter|insert|put|some)[-_ ]?[a-z0-9_ -]*(here|password|passwd|passphrase|secret|token|key)[a-z0-9_ -]*$`,
	`^x{3,}$`, `^\*{3,}$`, `^\.{3}$`, `^(example|placeholder|dummy|redacted|todo|tbd|fixme)$`,
]

placeholder_regex := concat("|", placeholder_patterns)

# Every placeholder pattern starts with one of these (compared lower-case): a prefix test is
# cheap, compiling placeholder_regex is not (~0.3 ms a call in regopy), so it runs only after.
placeholder_prefixes := [
	"<", "{{", "[", "please", "change", "replace", "update", "set", "your", "my", "choose",
	"enter", "insert", "put", "some", "xxx", "***", "...", "example", "placeholder", "dummy",
	"redacted", "todo", "tbd", "fixme",
]

# Password hashes (bcrypt, argon2, sha-crypt, PBKDF2, LDAP SSHA): not a password, but a hash
# worth keeping out of the file too (offline cracking): reported at info.
hash_regex := `^(\$2[abxy]?\$[0-9]{2}\$[./A-Za-z0-9]{53}|\$argon2(id|i|d)\$.+|\$[156]\$(rounds=[0-9]+\$)?[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{22,}|\$pbkdf2(-sha[0-9]+)?\$.+|\{S?SHA[0-9]*\}.+)$`

# The value without surrounding space and outer quotes (left by the list syntax, KEY="0"); as
# written when it has a backslash (lib.trim_safe: in one test, as the trimmed part has none).
unquoted(value) := trim(trim_space(value), `"'`) if {
	not contains(value, lib.backslash)
} else := value

# The value as compared: unquoted, lower-case.
plain(value) := lower(unquoted(value))

# plain(value) is computed once for both tests (each costs a few builtin calls in regopy).
not_secret(value) if harmless_or_placeholder(plain(value))

harmless_or_placeholder(plain_value) if plain_value in harmless_values

# (A value over lib.max_match is no placeholder: it is not given to the regex.)
harmless_or_placeholder(plain_value) if {
	strings.any_prefix_match(plain_value, placeholder_prefixes)
	lib.matchable(plain_value)
	regex.match(placeholder_regex, plain_value)
}

password_hash(value) if {
	hash_mark(value) # cheap, and false for nearly every value: no trimming for those
	stripped := unquoted(value)
	strings.any_prefix_match(stripped, ["$", "{"]) # every format above starts with "$", LDAP's with "{"
	lib.matchable(stripped) # over lib.max_match: no hash (and no regex)
	regex.match(hash_regex, stripped)
}

# A value that can be a password hash holds a "$" or a "{" (every format starts with one).
hash_mark(value) if contains(value, "$")

hash_mark(value) if contains(value, "{")

# One alternation per list: a regex.match per variable instead of one per pattern.
secret_name_regex := concat("|", secret_name_patterns)

reference_regex := concat("|", reference_suffixes)

# A literal that every secret name pattern contains: most names contain none, and this short
# pattern costs a third of secret_name_regex (regex.match compiles its pattern on every call,
# in time growing with its length). A pattern added to secret_name_patterns must contain one
# (secret_env_test.rego checks).
secret_name_hint := `PASS|SECRET|TOKEN|KEY|CREDENTIAL|PWD|DSN|CONNECTION`

secret_name(key) if {
	# bounded: only named_secret calls this, for a name within lib.max_match (upper may lengthen
	# it, at most threefold: these three patterns are literals, which do not recurse per byte)
	upper_key := upper(key)
	regex.match(secret_name_hint, upper_key)
	not regex.match(reference_regex, upper_key) # the shorter pattern first: *_FILE ends here
	regex.match(secret_name_regex, upper_key)
}

# One cheap pattern first: each check's literal contains one of its alternatives, and most
# values contain none (literals only, no classes: a class costs as much to compile as several
# literals). A check added to secret_value_checks must have a literal it matches
# (secret_env_test.rego checks).
secret_value_hint := `AKIA|-----BEGIN |gh|github_pat_|glpat-|xox|sk|AIza|eyJ|://`

# Only a value within lib.max_match meets the patterns (it bounds matches_a_check's too); a
# longer one gets too_long_to_check.
secret_value(value) if {
	lib.matchable(value)
	regex.match(secret_value_hint, value)
	matches_a_check(value) # a function of its own: in one body regopy repeats the hint per check
}

matches_a_check(value) if {
	# bounded: only secret_value calls this, for a value within lib.max_match
	some check in secret_value_checks
	contains(value, check[0])
	regex.match(check[1], value)
}

# A value pointing at a mounted secret file is the recommended pattern, not a leak.
file_reference(value) if startswith(value, "/run/secrets/")

# Literals of which a credential the checks find contains one, specific enough to be tested on
# a value too long for the checks (a CA bundle has "-----BEGIN CERTIFICATE", not "PRIVATE KEY-----";
# a URL with credentials, "://" and "@"): ``contains`` has no length limit.
long_value_markers := [
	"AKIA", "PRIVATE KEY-----", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
	"xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-", "sk_live_", "sk-", "AIza", "eyJ",
]

# Whether a value over lib.max_match may hold a credential (kind tests the length first: this
# costs ~0.4 ms per variable even when its first condition fails at once).
too_long_to_check(value) if has_a_marker(value)

too_long_to_check(value) if {
	contains(value, "://")
	contains(value, "@")
}

has_a_marker(value) if {
	some marker in long_value_markers
	contains(value, marker)
}

# Whether a variable's name announces a secret, as a value: computed once per variable (as a
# condition in two branches of kind, regopy evaluated the name's patterns twice); "long" for a
# name over lib.max_match, which no pattern is tried on.
named_secret(key) := "long" if {
	not lib.matchable(key)
} else := true if secret_name(key) else := false

# What one variable is, in one pass (the cases exclude each other): a name too long to inspect,
# a password hash (info), a literal value under a secret-looking name (``named``: named_secret;
# a value over lib.max_match is never harmless, a placeholder or a hash, so this needs no regex),
# a credential-shaped value under any other name, or such a value too long to inspect;
# undefined for everything else.
kind(named, value) := "long_name" if {
	named == "long"
} else := "hash" if {
	password_hash(value)
} else := "secret" if {
	named
	not not_secret(value)
	not file_reference(value)
} else := "credential" if {
	not named
	secret_value(value)
} else := "unchecked" if {
	not named
	not lib.matchable(value)
	too_long_to_check(value)
}

_over := concat("", [" (over ", format_int(lib.max_match, 10), " characters)"])

told := {
	"secret": {"text": " holds a literal secret value", "severity": "fail"},
	"credential": {"text": " holds a value that looks like a credential", "severity": "fail"},
	"hash": {"text": " holds a password hash (not the password; keep it in a secret all the same)", "severity": "info"},
	"long_name": {"text": concat("", [" has a name too long to inspect", _over]), "severity": "fail"},
	"unchecked": {"text": concat("", [" holds a value too long to inspect", _over, " with a credential marker"]), "severity": "fail"},
}

# The file's own text is judged: a value that references a variable (the normalizer keeps it as
# written, "${DB_PASSWORD}") is no literal, but the default of a whole-value reference
# ("${DB_PASSWORD:-hunter2}") is written in the file and judged as a value. A "$" followed by
# a letter, "_" or "{" is a reference ("$$" is an escaped "$").
reference(value) if {
	contains(value, "$")
	lib.matchable(value)
	regex.match(`(^|[^$])(\$\$)*\$(\{|[A-Za-z_])`, value)
}

# A value over lib.max_match with a "$" is judged as written (no regex over it).
literal(value) := value if {
	not reference(value)
} else := value if {
	password_hash(value) # "$argon2id$v=19$...": a hash, whose "$" are its own
} else := d if {
	lib.matchable(value)
	some m in regex.find_all_string_submatch_n(`^\$\{[A-Za-z_][A-Za-z0-9_]*:?-(.*)\}$`, value, 1)
	d := m[1]
	not reference(d)
}

# The variable a whole value refers to ("$DB_PASSWORD", "${DB_PASSWORD}", "${DB_PASSWORD:?...}").
referenced_variable(value) := m[1] if {
	reference(value)
	lib.matchable(value)
	some m in regex.find_all_string_submatch_n(`^\$\{?([A-Za-z_][A-Za-z0-9_]*)([:?+-].*)?\}?$`, value, 1)
}

# The .env file beside the compose file (or --env-file), which the CLI gives as input.dotenv
# ({name: value}; never over HTTP): a secret literal there is committed next to the file, a
# finding of its own at that .env's line (pointer /.env/<name>), warn: the file does not hold
# it, and whether the .env is committed or a deploy-time file is not for the preflight to know.
dotenv := object.get(input, "dotenv", {})

dotenv_told := {
	"secret": " secret committed in .env",
	"credential": " value that looks like a credential committed in .env",
	"hash": " password hash committed in .env",
	"long_name": " secret committed in .env",
	"unchecked": " value too long to inspect with a credential marker committed in .env",
}

_findings_1 := [[name, ["environment", key], concat("", ["environment ", key, told[k].text]), told[k].severity] |
	some name
	svc := input.fields.services[name]
	some key
	value := svc.environment[key]
	is_string(value)
	k := kind(named_secret(key), literal(value))
]

# Values that come from the .env: a whole-value reference, or a bare name (environment: [NAME]).
# (Nothing to look up without a .env: the server's case, and the CLI's without one.)
_from_dotenv := found if {
	count(dotenv) > 0
	found := [[name, key, variable] |
		some name
		svc := input.fields.services[name]
		some key
		value := svc.environment[key]
		variable := dotenv_variable(key, value)
		is_string(object.get(dotenv, variable, null))
	]
} else := []

dotenv_variable(key, value) := key if {
	value == null
} else := referenced_variable(value) if {
	is_string(value)
}

_findings_2 := [[f[0], concat("/", ["", ".env", lib.esc(f[2])]), concat("", ["environment ", f[1], ":", dotenv_told[k], " (", f[2], ")"]), severity] |
	some f in _from_dotenv
	k := kind(named_secret(f[1]), dotenv[f[2]])
	severity := dotenv_severity(k)
]

dotenv_severity(k) := "info" if {
	k == "hash"
} else := "warn"

findings := array.concat(_findings_1, _findings_2)
