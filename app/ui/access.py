"""What visitors may make the server load: the studio's access policy.

On loopback the visitor is the operator: any hub id, local model directory or data
directory. Once the studio is exposed (bound beyond loopback, or `--share`), a visitor could
otherwise load any directory on the server as a model, make it download any hub repo, or
read any dataset on its disk. Exposed, models are limited to the registry and the models
named on the command line, and server paths are refused, unless the operator passes
`--allow-local-paths`. No gradio import: the tests drive it directly.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agent.models import registry

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str | None) -> bool:
    """True for a loopback address or name; anything else (0.0.0.0, a LAN name) is exposed."""
    host = (host or "").strip().strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """exposed: reachable beyond this machine; open: the operator allowed paths anyway."""

    exposed: bool = False
    open: bool = False
    named: frozenset[str] = frozenset()  # models the operator named on the command line

    @classmethod
    def for_launch(cls, host: str | None, share: bool, allow_local_paths: bool = False,
                   named: tuple[str, ...] = ()) -> Access:
        return cls(exposed=share or not is_loopback(host), open=allow_local_paths,
                   named=frozenset(m.strip() for m in named if m and m.strip()))

    @property
    def restricted(self) -> bool:
        return self.exposed and not self.open

    def allowed_models(self) -> frozenset[str]:
        return frozenset(m.id for m in registry()) | self.named

    def model_problem(self, model: str) -> str | None:
        """Why a visitor may not load `model` here (a message), or None when they may."""
        if not self.restricted or model.strip() in self.allowed_models():
            return None
        return (f"{model!r} is not one of this studio's models. It is shared beyond this "
                "machine, so only the models in the list can be loaded (the operator can "
                "name more on the command line).")

    def data_dir_problem(self, data_dir: str) -> str | None:
        """Why a visitor may not read `data_dir` on the server, or None when they may."""
        if not data_dir.strip() or not self.restricted:
            return None
        return ("This studio is shared beyond its machine, so it reads no directories on the "
                "server: leave the directory empty to use the benchmark's own copy.")
