"""The dashboard: server-rendered pages over the session store and the training runs, served by
`sessionrl serve` and by `sessionrl ui` (see `sessionrl.ui.app`)."""

from sessionrl.ui.app import create_ui_app, mount
from sessionrl.ui.config import UIConfig

__all__ = ["UIConfig", "create_ui_app", "mount"]
