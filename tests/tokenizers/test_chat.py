"""Chat templates (``tokenizers/chat.py``) and ``gptlab chat`` driven through stdin."""

from __future__ import annotations

import io

import pytest

import gptlab
from gptlab.cli import main
from gptlab.errors import GptlabError
from gptlab.tokenizers import CharTokenizer
from gptlab.tokenizers.chat import ChatTemplate, encode_chat, stop_ids, template_for
from tests._tiny import tiny_model

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
# SmolLM2-Instruct's template, as its GGUF file carries it
SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_fallbacks_render_their_formats():
    assert ChatTemplate.named("chatml").render(MSGS) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    llama3 = ChatTemplate.named("llama3", {"bos_token": "<|begin_of_text|>"}).render(MSGS[1:])
    assert llama3 == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    plain = ChatTemplate.named("plain")
    assert plain.render(MSGS) == "system: Be brief.\nuser: Hi there\nassistant:"
    assert plain.render(MSGS, add_generation_prompt=False).endswith("Hi there\n")
    assert "\nuser:" in plain.stop_strings


def test_model_template_with_default_system_message():
    t = ChatTemplate(SMOL)
    one = t.render(MSGS[1:])
    assert one.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert one.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" not in t.render(MSGS)  # a system message replaces the default one


def test_template_errors_are_gptlab_errors():
    refuse = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}{% endif %}"
    )
    with pytest.raises(GptlabError, match="users first"):
        refuse.render(MSGS)
    with pytest.raises(GptlabError, match="not valid Jinja"):
        ChatTemplate("{% for %}").render(MSGS)
    with pytest.raises(GptlabError, match="at least one message"):
        ChatTemplate.named("chatml").render([])
    with pytest.raises(GptlabError, match="unknown chat template"):
        ChatTemplate.named("vicuna")


def test_the_sandbox_refuses_mutation_and_internals():
    with pytest.raises(GptlabError):  # ImmutableSandboxedEnvironment: no list.append
        ChatTemplate("{{ messages.append({'role': 'x', 'content': 'y'}) }}").render(MSGS)
    with pytest.raises(GptlabError):
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render(MSGS)


def test_tojson_keeps_unicode():
    assert (
        ChatTemplate("{{ messages[0]['content'] | tojson }}").render([{"role": "u", "content": "café"}])
        == '"café"'
    )


def test_template_for_picks_the_tokenizers_own_then_a_fallback():
    tok = CharTokenizer.from_text(
        "abcdefghijklmnopqrstuvwxyz\n", special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    assert template_for(tok).name == "chatml"
    assert stop_ids(tok) == [tok.special_tokens["<|im_end|>"]]
    tok.chat_template = SMOL
    assert template_for(tok).name == "model"
    assert template_for(tok, "plain").name == "plain"
    assert template_for(CharTokenizer.from_text("abc")).name == "plain"
    ids = encode_chat(tok, [{"role": "a", "content": "b"}], template_for(tok, "chatml"))
    assert ids[0] == tok.special_tokens["<|im_start|>"]  # the template's special tokens are matched


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    text = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,?!'"
    tok = CharTokenizer.from_text(text, special_tokens=["<|im_start|>", "<|im_end|>"])
    model = tiny_model(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2, pos="rope")
    return gptlab.save(model, tok, tmp_path_factory.mktemp("chat") / "ckpt")


def _chat(monkeypatch, capsys, ckpt, lines: str, *extra: str) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    assert main(["chat", str(ckpt), "--max-new-tokens", "12", *extra]) == 0
    return capsys.readouterr().out


def test_chat_cli_streams_keeps_history_and_resets(tiny_chat, monkeypatch, capsys):
    seen = []
    from gptlab.cli import chat as chat_cli

    real = chat_cli.reply

    def spy(model, tokenizer, template, messages, config, *cache):
        seen.append([dict(m) for m in messages])
        return real(model, tokenizer, template, messages, config, *cache)

    monkeypatch.setattr(chat_cli, "reply", spy)
    out = _chat(monkeypatch, capsys, tiny_chat, "hello\nhow are you\n/reset\nagain\n/exit\nnever read\n")
    assert "(history cleared)" in out
    assert [len(m) for m in seen] == [1, 3, 1]  # the 2nd turn sees turn 1's question and reply
    assert seen[1][0]["content"] == "hello" and seen[1][1]["role"] == "assistant"
    assert seen[2] == [{"role": "user", "content": "again"}]


def test_chat_cli_same_reply_as_the_template_prompt(tiny_chat, monkeypatch, capsys):
    """Greedy: the chat's reply equals generating from the rendered template, stopped at <|im_end|>."""
    from gptlab.generate import SampleConfig, generate_text

    model, tok = gptlab.load(tiny_chat)
    prompt = template_for(tok).render([{"role": "user", "content": "hi"}])
    expect = generate_text(
        model, tok, prompt, SampleConfig(max_new_tokens=12, temperature=0.0, stop_tokens=stop_ids(tok))
    )
    out = _chat(monkeypatch, capsys, tiny_chat, "hi\n")
    assert out == expect + "\n"


def test_chat_cli_errors(tiny_chat, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", str(tiny_chat), "--template", "no-such-template"]) == 2
    assert capsys.readouterr().err.startswith("error: --template")
