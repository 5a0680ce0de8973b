"""Chat templates: where they come from, how they render, what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.serve.chat import load_chat_template, read_messages
from kvsched.serve.errors import ApiError

TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"


def write_config(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_template_from_tokenizer_config_with_its_special_tokens(tmp_path: Path) -> None:
    t = load_chat_template(write_config(tmp_path, chat_template=TEMPLATE,
                                        bos_token={"content": "<s>"}), None)
    assert t is not None
    assert t.render([{"role": "user", "content": "hi"}], True, {}) == "<s>[user]hi"


def test_named_templates_take_default_and_none_means_no_chat(tmp_path: Path) -> None:
    t = load_chat_template(write_config(tmp_path, chat_template=[
        {"name": "tool_use", "template": "x"}, {"name": "default", "template": "D{{ messages|length }}"}]),
        None)
    assert t is not None and t.render([{"role": "user", "content": "a"}], True, {}) == "D1"
    assert load_chat_template(write_config(tmp_path, bos_token="<s>"), None) is None


def test_override_is_a_file_or_the_template_itself(tmp_path: Path) -> None:
    write_config(tmp_path)
    path = tmp_path / "t.jinja"
    path.write_text("F{{ add_generation_prompt }}")
    by_file = load_chat_template(tmp_path, str(path))
    assert by_file is not None and by_file.render([], True, {}) == "FTrue"
    inline = load_chat_template(tmp_path, "I{{ x }}")
    assert inline is not None and inline.render([], False, {"x": 7}) == "I7"
    with pytest.raises(UserInputError, match="no such file"):
        load_chat_template(tmp_path, "missing.jinja")
    with pytest.raises(UserInputError, match="not a valid Jinja template"):
        load_chat_template(tmp_path, "{% for %}")


def test_a_template_that_raises_is_a_400(tmp_path: Path) -> None:
    t = load_chat_template(write_config(tmp_path, chat_template="{{ raise_exception('no system') }}"),
                           None)
    assert t is not None
    with pytest.raises(ApiError, match="no system"):
        t.render([{"role": "system", "content": "x"}], True, {})


def test_the_sandbox_keeps_templates_off_python_internals(tmp_path: Path) -> None:
    t = load_chat_template(write_config(tmp_path, chat_template="{{ ''.__class__.__mro__ }}"), None)
    assert t is not None
    with pytest.raises(ApiError):
        t.render([], True, {})


def test_messages() -> None:
    got = read_messages({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}]})
    assert [m["content"] for m in got] == ["a\nb", ""]
    for bad in ([], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], ["x"]):
        with pytest.raises(ApiError) as err:
            read_messages({"messages": bad})
        assert err.value.param == "messages"
