"""A model's own Jinja chat template, rendered as HF renders it (speclm/backends/chat_template.py)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from speclm.backends.chat_template import _compiled, render_chat
from speclm.errors import InvalidRequestError

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_messages_render_through_the_template_with_its_special_tokens():
    text = render_chat(TEMPLATE, [{"role": "user", "content": "hi"}], eos_token="</s>")
    assert text == "<|user|>hi</s><|assistant|>"


def test_a_template_is_compiled_once_and_renders_each_request_its_own_messages():
    _compiled.cache_clear()
    asks = [[{"role": "user", "content": f"question {i}"}] for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda m: render_chat(TEMPLATE, m), asks))
    assert texts == [f"<|user|>question {i}<|assistant|>" for i in range(32)]
    assert _compiled.cache_info().currsize == 1


def test_a_template_that_does_not_compile_is_a_clear_error_every_time():
    for _ in range(2):  # a failed compile is not remembered as a template
        with pytest.raises(InvalidRequestError, match="could not render the model's chat template"):
            render_chat("{% for m in messages %}", [{"role": "user", "content": "hi"}])


def test_the_template_may_reject_messages_with_its_own_words():
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    with pytest.raises(InvalidRequestError, match="rejected the messages: first must be user"):
        render_chat(template, [{"role": "system", "content": "x"}])
    assert render_chat(template, [{"role": "user", "content": "x"}]) == "ok"


def test_a_message_without_role_or_content_is_named():
    with pytest.raises(InvalidRequestError, match="needs 'role' and 'content'"):
        render_chat(TEMPLATE, [{"role": "user"}])
