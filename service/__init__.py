"""Platform control plane: AuthN -> AuthZ -> Approval -> Execute -> Audit."""

__version__ = "0.1.0"
