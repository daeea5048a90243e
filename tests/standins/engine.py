"""The model behind every stand-in (tests/standins/): a tokenizer of words and marks, a
prefix cache of token runs, and one fixed answer, each step taking a set time. It is no
server's code; what each server does around its engine (its wire, its accounts, its
refusals) is the stand-in's, copied from that server's source.

Its times are real: the stand-in sleeps them (`asyncio.sleep`), so what it reports fits
inside what the client measures, as a real server's does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: the answer every stand-in gives, cut at max_tokens
ANSWER = (
    "Sunlight scatters off the molecules of the air, and short blue waves scatter far "
    "more than long red ones, so blue light reaches the eye from every part of the sky."
)
_TOKEN = re.compile(r"^\s+|[\w']+\s*|[^\w\s]\s*")


def tokens(text: str) -> list[str]:
    """`text` as the toy model's tokens (words and marks, each with the space after it)."""
    return _TOKEN.findall(text)


def chat_prompt(messages: list[dict[str, object]]) -> str:
    """The messages in a ChatML-like template, ready for the assistant's answer."""
    out = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n" for m in messages)
    return out + "<|im_start|>assistant\n"


@dataclass
class Run:
    """One request through the engine: its prompt's tokens, how many were found cached,
    and the answer's tokens."""

    prompt: list[str]
    cached: int
    answer: list[str]
    finish: str  # "stop" (the answer ended) or "length" (max_tokens)


@dataclass
class ToyEngine:
    """One engine, one request at a time. `page`: the cache's grain in tokens (1: any
    prefix; 32: whole blocks of 32). Times in seconds."""

    page: int = 1
    load_s: float = 0.0  # the first request's wait for the model (Ollama loads lazily)
    schedule_s: float = 0.004  # from the queue to the first forward pass
    prefill_s_per_token: float = 0.0004
    prefill_base_s: float = 0.01
    decode_s: float = 0.003
    held: list[list[str]] = field(default_factory=list)
    loaded: bool = False

    def cached(self, prompt: list[str]) -> int:
        """The longest prefix of `prompt` the cache holds, in whole pages."""
        best = 0
        for run in self.held:
            n = 0
            for a, b in zip(run, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        best = min(best, len(prompt) - 1)  # the last prompt token is always computed
        return best - best % self.page

    def plan(self, messages: list[dict[str, object]], max_tokens: int) -> Run:
        """What the engine will do for `messages` (nothing is run yet)."""
        prompt = tokens(chat_prompt(messages))
        answer = tokens(ANSWER)
        finish = "stop"
        if len(answer) > max_tokens:
            answer, finish = answer[:max_tokens], "length"
        return Run(prompt, self.cached(prompt), answer, finish)

    def load(self) -> float:
        """The seconds loading the model takes now (0 when it is loaded): the stand-in
        sleeps them."""
        if self.loaded:
            return 0.0
        self.loaded = True
        return self.load_s

    def prefill_time(self, run: Run) -> float:
        """The seconds the prefill of `run`'s uncached prompt takes."""
        return self.prefill_base_s + self.prefill_s_per_token * (len(run.prompt) - run.cached)

    def remember(self, run: Run) -> None:
        """Hold `run`'s prompt and answer in the cache (a radix cache keeps both)."""
        self.held.append(run.prompt + run.answer)
