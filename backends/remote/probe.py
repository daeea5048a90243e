"""Asking a server once what it is: its family, the models it lists, its window; and
finding the servers that run on this machine.

A probe is the remote backend's own start (`RemoteBackend.start`: its `GET /v1/models`,
the families' detection in backends/remote/servers/, the window look-up), made with a short
deadline and closed at once, so what the switcher says of a server is what a switch to
it will find. Finding servers here asks loopback only (127.0.0.1), on the ports the
usual servers listen on, never another host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

import httpx

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.httplog import check_base_url, redact_url
from phasechat.backends.remote.servers import GENERIC

#: Where the usual servers listen by default, with the name each is known by.
USUAL_PORTS: dict[int, str] = {
    8080: "llama-server",
    11434: "Ollama",
    8000: "vLLM",
    30000: "SGLang",
    1234: "LM Studio",
}
#: How long one probe may take (connect, listing, window), in seconds.
PROBE_S = 4.0
#: How long the search for local servers may take in all, in seconds.
LOCAL_S = 2.0


@dataclass(frozen=True, slots=True)
class Probe:
    """What one server answered just now; `problem` (one line) when it did not."""

    base_url: str
    family: str = ""
    models: tuple[str, ...] = ()
    window: int | None = None
    problem: str | None = None
    #: the HTTP status its listing answered with (None: no answer at all)
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def needs_key(self) -> bool:
        """It refused the request for want of a key, or of a good one (HTTP 401, 403)."""
        return self.status in (401, 403)

    @property
    def port(self) -> int | None:
        return httpx.URL(self.base_url).port

    @property
    def slug(self) -> str:
        """A name for a profile of it: its family's (`llama-server`), else its host's."""
        if self.family and self.family != GENERIC.name:
            return self.family.lower().replace(" ", "-")
        url = httpx.URL(self.base_url)
        return f"{url.host}-{url.port}" if url.port else url.host

    def line(self) -> str:
        """ "llama-server · SmolLM2-135M-Instruct · window 4,096" or what went wrong."""
        if self.problem is not None:
            return self.problem
        models = (
            shown_model(self.models[0]) if len(self.models) == 1 else f"{len(self.models)} models"
        )
        window = f"window {self.window:,}" if self.window else "window not said"
        return f"{self.family} · {models} · {window}"


def shown_model(model: str) -> str:
    """A model's id as a line shows it: a GGUF file's name without its folder and
    extension (llama-server lists the path it was started with), else the id."""
    if model.endswith(".gguf") or model.startswith("/"):
        return PurePath(model).name.removesuffix(".gguf")
    return model


def base_url_of(text: str) -> str:
    """A base URL from what a user typed: `http://` when no scheme is given, `/v1` when
    no path is. Raises ValueError (one line) when it cannot be a server's URL."""
    url = text.strip()
    if not url:
        raise ValueError("no URL given")
    if "://" not in url:
        url = f"http://{url}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {redact_url(url)}")
    check_base_url(url)
    if httpx.URL(url).path in ("", "/"):
        url = url.rstrip("/") + "/v1"
    return url


#: The variable a probe with no key reads: no environment holds a variable without a name.
NO_KEY = ""


async def probe(
    base_url: str, api_key_env: str | None = "OPENAI_API_KEY", timeout_s: float = PROBE_S
) -> Probe:
    """Ask the server at `base_url` what it is (the key, if any, from `api_key_env`;
    None: send no key, as to a server found on this machine that no profile names)."""
    config = RemoteConfig(
        base_url=base_url,
        api_key_env=NO_KEY if api_key_env is None else api_key_env,
        name="probe",
        connect_timeout_s=timeout_s,
        listing_timeout_s=timeout_s,
    )
    backend = RemoteBackend(config)
    try:
        async with asyncio.timeout(timeout_s + 1):
            await backend.start()
    except TimeoutError:
        return Probe(base_url, problem=f"no answer from {backend.shown_url} within {timeout_s:g} s")
    finally:
        await backend.aclose()
    status = backend.listing_status
    if backend.state != "ready":
        problem = backend.state_detail
        if api_key_env is None and status in (401, 403):  # no key's variable to check
            problem = (
                f"HTTP {status} from {backend.shown_url}: no key was sent (add it by its URL"
                " with the name of the variable that holds its key)"
            )
        return Probe(base_url, problem=problem, status=status)
    if not backend.models:
        return Probe(
            base_url,
            problem=f"{backend.shown_url}/models answered with no model list: "
            "not an OpenAI-compatible server (a web page? check the URL)",
            status=backend.listing_status,
        )
    family, window = backend.family.name, backend.context_window
    return Probe(base_url, family, tuple(backend.models), window, status=backend.listing_status)


def local_urls(profile_urls: Iterable[str] = ()) -> list[str]:
    """The base URLs to look at on this machine: the usual ports, and the ports of the
    profiles' URLs that are on loopback (nothing beyond 127.0.0.1 is asked)."""
    ports = list(USUAL_PORTS)
    for url in profile_urls:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            continue
        if (parsed.host == "localhost" or parsed.host.startswith("127.")) and parsed.port:
            ports.append(parsed.port)
    return [f"http://127.0.0.1:{port}/v1" for port in dict.fromkeys(ports)]


def port_keys(key_envs: Mapping[str, str]) -> dict[int, str]:
    """The variable holding each loopback port's key, from the profiles' base URLs
    (`key_envs`: a URL and its profile's `api_key_env`): a profile's own port is asked
    with its own key, as a switch to it would be; the first profile at a port wins."""
    ports: dict[int, str] = {}
    for url, env in key_envs.items():
        with contextlib.suppress(httpx.InvalidURL):
            parsed = httpx.URL(url)
            if parsed.port and (parsed.host == "localhost" or parsed.host.startswith("127.")):
                ports.setdefault(parsed.port, env)
    return ports


async def find_local(
    profile_urls: Iterable[str] = (),
    deadline_s: float = LOCAL_S,
    key_envs: Mapping[str, str] | None = None,
) -> list[Probe]:
    """The servers that answer on this machine's usual ports (and the profiles' own),
    each probed at once: those that list models, and those that answer HTTP with a
    refusal (a server still loading its model, one that wants a key, a web page);
    those that do not answer within `deadline_s` are left out. `key_envs` (a profile's
    URL and the variable holding its key): that profile's port is asked with its key;
    other ports with none."""
    keys = port_keys(key_envs or {})
    urls = local_urls([*profile_urls, *(key_envs or {})])

    # a port no profile names gets no key: the user's key is not for whatever listens there
    asked = (probe(url, keys.get(httpx.URL(url).port or 0), deadline_s) for url in urls)
    found = await asyncio.gather(*asked)
    return [p for p in found if p.status is not None]
