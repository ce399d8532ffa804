package controlplane.compose.tests.sensitive_mounts

import rego.v1

import data.controlplane.compose.rules.sensitive_mounts as rule

test_sockets if {
	rule.sensitive("/var/run/docker.sock") == "container runtime socket"
	rule.sensitive("/run/user/1000/podman/podman.sock") == "container runtime socket"
}

test_trees_and_their_subdirectories if {
	every path in ["/etc", "/etc/nginx", "/etc/ssh/ssh_host_rsa_key", "/root/.ssh", "/usr", "/usr/bin", "/usr/src", "/lib/modules", "/proc/1", "/sys/fs/cgroup", "/boot", "/dev/bus/usb", "/var/lib/postgresql/data", "/", "/var"] {
		rule.sensitive(path) == "sensitive host path"
	}
	rule.sensitive("~") == "home directory"
	rule.sensitive("~/.ssh") == "home directory"
	rule.sensitive("/home/alice/") == "home directory"
	rule.sensitive("/home/alice") == "home directory"
	rule.sensitive("/home/alice/.ssh/id_rsa") == "home directory"
}

test_harmless_paths if {
	every path in ["/etc/localtime", "/etc/timezone", "/srv/app", "/var/log/app", "/opt/app/config", "./data", "/etcetera", "/homework", "~/minecraft_data", "/home/alice/projects", "/usr/share/appdata/wireguard/config", "/usr/local/share/app"] {
		not rule.sensitive(path)
	}
}

test_read_only_lowers_the_severity_but_not_for_a_socket if {
	rule.grade("sensitive host path", {}, true) == "warn"
	rule.grade("sensitive host path", {}, false) == "fail"
	rule.grade("container runtime socket", {"image": "traefik:3"}, true) == "fail"
	rule.grade("container runtime socket", {"image": "tecnativa/docker-socket-proxy:0.3"}, true) == "warn"
	rule.grade("container runtime socket", {"image": "tecnativa/docker-socket-proxy:0.3"}, false) == "fail"
}

test_socket_proxy_images if {
	rule.socket_proxy({"image": "tecnativa/docker-socket-proxy"})
	rule.socket_proxy({"image": "lscr.io/linuxserver/socket-proxy:1.26@sha256:abc"})
	rule.socket_proxy({"image": "ghcr.io/wollomatic/socket-proxy:1"})
	not rule.socket_proxy({"image": "traefik:3"})
	not rule.socket_proxy({})
}
