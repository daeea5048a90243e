"""phasechat: a terminal chat client for LLMs that shows, live, where the time goes."""

import os

__version__ = "0.1.0"

#: The layers: top-level folders of the repository (the design card's layout), each one
#: linked here as phasechat/<name>, so that `phasechat.<name>` is the only name they have.
LAYERS = ("backends", "chat", "telemetry", "tui", "themes")


def _check_links() -> None:
    """A clone made without symlinks (`core.symlinks=false`, Git for Windows' usual
    setting) checks each link out as a small text file holding its target; the first
    import of a layer would then fail far from the cause. Say the cause and the fix.
    (Five stat calls on phasechat's own files; an installed wheel has real folders.)"""
    here = os.path.dirname(__file__)
    for name in LAYERS:
        if os.path.isfile(os.path.join(here, name)):
            raise ImportError(
                f"phasechat/{name} is a text file: this clone has no symlinks; "
                "clone with `git clone -c core.symlinks=true`"
            )


_check_links()
