"""The first screen: there until the chat's first answer (backend, model, the phases,
the keys, prompts to try), and back in a new chat."""

from __future__ import annotations

from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.welcome import QUANT, Welcome
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend


def test_a_quantization_is_read_from_the_files_name() -> None:
    found = [
        QUANT.search(n.upper())
        for n in (
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "m-q4_k_m.gguf",
            "qwen3-8b-bf16.gguf",
            "model.gguf",
            "Q4X.gguf",
        )
    ]
    assert [f.group(1) if f else None for f in found] == ["Q4_1", "Q4_K_M", "BF16", None, None]


async def test_the_first_screen_is_there_until_the_first_answer_and_back_in_a_new_chat() -> None:
    app = PhasechatApp(settings=Settings(), backend=ScriptedBackend())
    async with app.run_test(size=(120, 40)) as pilot:
        welcome = app.query_one(Welcome)
        assert welcome.display
        text = str(welcome.render())
        assert "scripted · scripted-model" in text and "Prefill" in text and "F8" in text
        app.chat.send("hello")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert not welcome.display
        app.chat.action_new_chat()
        await wait_for(pilot, lambda: welcome.display)
