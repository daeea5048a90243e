"""Servers we do not run: the one backend for every OpenAI-compatible server, over httpx,
with what it reads of the wire and of each server family (servers/)."""
