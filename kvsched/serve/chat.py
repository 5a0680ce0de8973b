"""Chat prompts: the checkpoint's chat template (Jinja, as transformers renders it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from kvsched.errors import UserInputError
from kvsched.hf_config import read_config_json
from kvsched.serve.errors import ApiError

_ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled template and the special tokens it may refer to."""

    source: str
    template: jinja2.Template
    bos_token: str
    eos_token: str

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               extra: dict[str, Any]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as err:
            raise ApiError(f"messages: the chat template failed: {err}", param="messages") from None


def _raise_exception(message: str) -> None:
    # The helper transformers gives templates to reject a conversation.
    raise jinja2.TemplateError(message)


def _token_text(value: Any) -> str:
    """tokenizer_config.json writes a special token as text or {"content": text}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def load_chat_template(tokenizer_dir: Path, override: str | None) -> ChatTemplate | None:
    """``override`` (``--chat-template``: a file, or the template itself), else
    tokenizer_config.json's ``chat_template`` (text, or a list of named
    templates: the one named "default"), else None (chat is refused)."""
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = read_config_json(config_path) if config_path.is_file() else {}
    source: Any = None
    if override is not None:
        path = Path(override)
        is_file = "\n" not in override and "{" not in override and path.is_file()
        source = path.read_text(encoding="utf-8") if is_file else override
        if not is_file and "{" not in override:
            raise UserInputError(f"--chat-template={override!r}: no such file, and not a Jinja "
                                 "template; give a template file or its text")
    else:
        source = config.get("chat_template")
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if source is None:
            return None
        if not isinstance(source, str):
            raise UserInputError(f"{config_path}: chat_template must be a string or a list of "
                                 "{name, template}; give --chat-template instead")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        where = "--chat-template" if override is not None else f"{config_path}: chat_template"
        raise UserInputError(f"{where}: not a valid Jinja template ({err})") from None
    return ChatTemplate(source, template, _token_text(config.get("bos_token")),
                        _token_text(config.get("eos_token")))


def read_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages``: a non-empty list of {role, content}; content is text or a
    list of text parts (joined with newlines, as vLLM does for text-only models)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages: give a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(f"{where}: must be an object with role and content", param="messages")
        role = message.get("role")
        if role not in _ROLES:
            raise ApiError(f"{where}.role={role!r:.40}: must be one of {', '.join(_ROLES)}",
                           param="messages")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                        part.get("text"), str):
                    raise ApiError(f"{where}.content[{j}]: only text parts ({{'type': 'text', 'text': "
                                   "...}) are supported (the model takes text only)", param="messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise ApiError(f"{where}.content: must be a string or a list of text parts",
                           param="messages")
        out.append({**message, "content": content})
    return out
