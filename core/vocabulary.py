"""Naming a process group's parallelism axis from its description (one rule for the engine and
the live agent).

PyTorch names the groups a DeviceMesh creates ``mesh_<dim name>`` and the default group
``default_pg``; groups made with ``new_group(group_desc=...)`` carry the user's description, and
groups without one say ``undefined``.
"""

from __future__ import annotations

__all__ = ["WORLD_AXIS", "axis_from_description"]

WORLD_AXIS = "world"
_MESH_PREFIX = "mesh_"


def axis_from_description(desc: str) -> str | None:
    """``mesh_<dim>`` -> ``<dim>``, ``default_pg`` -> ``world``, any other description -> itself;
    None when the description says nothing (empty or ``undefined``)."""
    desc = desc.strip()
    if desc.startswith(_MESH_PREFIX) and len(desc) > len(_MESH_PREFIX):
        return desc[len(_MESH_PREFIX) :]
    if desc == "default_pg":
        return WORLD_AXIS
    if desc and desc != "undefined":
        return desc
    return None
