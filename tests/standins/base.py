"""What every stand-in keeps for the test beside what it serves: what it said of each
request (`sent`), the bodies it was sent and the paths it was asked, given at
`GET /_standin/record` (tests/standins/__init__.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response


@dataclass
class StandIn:
    """A stand-in's own record; `new_app()` is its FastAPI app, logging every path."""

    sent: list[Any] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def new_app(self) -> FastAPI:
        app = FastAPI()
        app.middleware("http")(self._log)
        return app

    async def record(self) -> dict[str, Any]:
        """What it said of each request, the bodies it was sent and the paths asked."""
        return {"sent": [asdict(s) for s in self.sent], "bodies": self.bodies, "paths": self.paths}

    async def _log(self, request: Request, call_next: Any) -> Response:
        if not request.url.path.startswith("/_standin/"):
            self.paths.append(request.url.path)
        response: Response = await call_next(request)
        return response
