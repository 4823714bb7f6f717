"""Old import paths kept for one minor version after a module moved: importing one warns.

Each old path is a small module that re-exports the new module's names (the same objects) and
calls `warn_moved` once, when it is first imported.
"""

from __future__ import annotations

import warnings

__all__ = ["REMOVED_IN", "warn_moved"]

# The release that drops the old paths.
REMOVED_IN = "0.3.0"


def warn_moved(old: str, new: str) -> None:
    """Warn, as a `DeprecationWarning` pointed at the importing line, that `old` is now `new`."""
    # stacklevel 3: past this function and the old module's body to the line that imported it
    # (the warnings module skips the import machinery's own frames).
    warnings.warn(
        f"{old} has moved to {new}; import it from there ({old} goes in mfuscope {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=3,
    )
