"""An ollama ``Modelfile`` beside an exported GGUF file: ``ollama create NAME -f Modelfile`` imports it.

    FROM ./model.gguf
    TEMPLATE <the chat format as a Go template, where it is known>
    PARAMETER stop "<|im_end|>"
    PARAMETER num_ctx 64

ollama writes prompts with Go templates, not Jinja, so a model's Jinja chat template is mapped by the
chat format it spells (``GO_TEMPLATES``: ChatML, Llama 3); a model without a known chat format gets the
raw-completion template ``{{ .Prompt }}``. Stop strings are the texts of the vocabulary's stop ids.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptlab.fileio import atomic_write_text
from gptlab.interop.gguf_vocab import Vocab

#: A marker the Jinja template holds → the same chat format as an ollama Go template.
GO_TEMPLATES: dict[str, str] = {
    "<|im_start|>": (
        "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
        "<|im_start|>assistant\n"
    ),
    "<|start_header_id|>": (
        "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
        "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
        "{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
}
RAW = "{{ .Prompt }}"


def go_template(vocab: Vocab) -> str:
    """The ollama template for ``vocab``'s chat format (``RAW`` where there is none gptlab knows)."""
    template = vocab.chat_template or ""
    return next((go for marker, go in GO_TEMPLATES.items() if marker in template), RAW)


def modelfile_text(gguf_name: str, vocab: Vocab, num_ctx: int) -> str:
    """The Modelfile's text: FROM the file beside it, TEMPLATE, stop strings, the context length."""
    template = go_template(vocab).replace('"""', '\\"\\"\\"')
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{template}"""']
    for i in vocab.stop_ids:
        lines.append(f"PARAMETER stop {json.dumps(vocab.tokens[i], ensure_ascii=False)}")
    lines.append(f"PARAMETER num_ctx {num_ctx}")
    return "\n".join(lines) + "\n"


def write_modelfile(gguf_path: Path, vocab: Vocab, num_ctx: int) -> Path:
    """Write ``Modelfile`` beside ``gguf_path`` (atomically) and return its path."""
    return atomic_write_text(gguf_path.parent / "Modelfile", modelfile_text(gguf_path.name, vocab, num_ctx))


__all__ = ["GO_TEMPLATES", "go_template", "modelfile_text", "write_modelfile"]
