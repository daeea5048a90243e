"""phasechat: a terminal chat client for LLMs that shows, live, where the time goes."""

__version__ = "0.1.0"
