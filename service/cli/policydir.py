"""Which policies directory a ``cpctl policy`` verb works on: one function for every verb.

``resolve``: the directory given on the command line; else ``./policies`` of the working
directory when there is one; else the configured ``policies.dir`` (``--config``,
``CONTROLPLANE_CONFIG``, ``CONTROLPLANE_POLICIES__DIR``) when it exists; else an error naming
both. Every verb prints which one it used and why (``describe``), so ``publish`` never signs a
tree the operator did not mean.
"""

from __future__ import annotations

from pathlib import Path

from .. import config as config_mod

__all__ = ["PolicyDirError", "resolve"]


class PolicyDirError(Exception):
    """No policies directory: the message names what was looked for."""


def resolve(explicit: Path | None, config_path: str | Path | None = None
            ) -> tuple[Path, str]:
    """(the policies directory, how it was chosen)."""
    if explicit is not None:
        return Path(explicit), "from the command line"
    local = Path.cwd() / "policies"
    if local.is_dir():
        return local, "default ./policies"
    try:
        configured = config_mod.load_from_process(config_path).policies.dir
    except config_mod.ConfigError as exc:
        raise PolicyDirError(f"no ./policies in {Path.cwd()}, and the configuration cannot be "
                             f"read for policies.dir: {exc}") from None
    if configured.is_dir():
        return configured, "configured policies.dir"
    raise PolicyDirError(f"no policies directory: neither ./policies (in {Path.cwd()}) nor the "
                         f"configured policies.dir ({configured}) exists; pass the directory")
