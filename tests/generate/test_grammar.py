"""Structured output in the library: every tokenizer kind as the grammar engine's table, JSON schemas,
regexes and Lark grammars as masks in the per-request sampler, and what may not be asked."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig, generate_batch, generate_text, prepared_of
from gptlab.generate.driver import decode_rows, start
from gptlab.generate.grammar import Constraint, accepts, engine_tokenizer, token_table
from gptlab.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer
from tests._structured import JSON_ALPHABET, SCHEMAS, validate
from tests._tiny import tiny_model

MAX_NEW = 80


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(vocab_size=tok.vocab_size, block_size=128)


# ------------------------------------------------------------------ tokenizer tables
def _check_table(tok) -> None:
    table = token_table(tok)
    lltok = engine_tokenizer(tok)
    assert engine_tokenizer(tok) is lltok  # built once per tokenizer
    assert lltok.vocab_size == len(table.tokens) >= tok.vocab_size
    text = '{"a": [1, 2]}'
    ids = tok.encode(text)
    assert lltok.decode_bytes(ids) == text.encode()
    for name, i in tok.special_tokens.items():
        assert i in table.special and lltok.is_special_token(i), name
    assert table.eos == (tok.eot_id if tok.eot_id is not None else tok.vocab_size)
    # the engine reads the tokenizer's own ids: a schema's text in those ids is accepted whole
    config = SampleConfig(json_schema={"type": "object"})
    assert accepts(config, tok, ids, complete=True)
    assert accepts(config, tok, ids[:-1]) and not accepts(config, tok, ids[:-1], complete=True)
    assert not accepts(config, tok, tok.encode("[1]"))


def test_char_tokenizer_table(tok):
    _check_table(tok)
    no_eot = CharTokenizer.from_text(JSON_ALPHABET)  # no end-of-text: an id past the vocabulary ends
    assert token_table(no_eot).eos == no_eot.vocab_size
    _check_table(no_eot)
    unk = CharTokenizer.from_text(JSON_ALPHABET, unk="?")
    assert unk.unk_id in token_table(unk).special


def test_trained_bpe_table():
    text = '{"name": "ann", "age": 31, "tags": ["a", "b"]} ' * 20 + "the quick brown fox " * 20
    _check_table(BPETokenizer.train(text, vocab_size=300))


def test_gpt2_table(gpt2_files):
    gpt2 = GPT2Tokenizer.from_files(*gpt2_files)
    _check_table(gpt2)
    table = token_table(gpt2)
    assert table.eos == 50256 and len(table.tokens) == 50257


# ------------------------------------------------------------------ generation under a schema
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_stopped_reply_validates_and_every_cut_one_is_a_prefix(model, tok, name):
    schema = SCHEMAS[name]
    stopped = 0
    for seed in range(12):
        config = SampleConfig(json_schema=schema, seed=seed, max_new_tokens=MAX_NEW, temperature=1.2)
        events = list(_events(model, tok, "data:", config))
        text = "".join(e.text for e in events)
        ids = [e.token_id for e in events if e.token_id is not None]
        reason = events[-1].finish_reason
        if reason == "stop":
            stopped += 1
            validate(json.loads(text), schema)
        else:
            assert reason == "length" and len(ids) == MAX_NEW
            assert accepts(config, tok, ids)
    assert stopped >= 6  # the schemas are small: most replies finish


def _events(model, tok, prompt, config):
    session, rows = start(model, tok, [tok.encode(prompt)], config, None)
    return decode_rows(session, rows)


def test_greedy_and_top_k_p_choose_among_allowed_tokens_only(model, tok):
    schema = SCHEMAS["flat"]
    for extra in (
        {"temperature": 0},
        {"top_k": 3},
        {"top_p": 0.5},
        {"min_p": 0.2},
        {"repetition_penalty": 1.5},
    ):
        text = generate_text(
            model, tok, "x", SampleConfig(json_schema=schema, max_new_tokens=MAX_NEW, seed=1, **extra)
        )
        validate(json.loads(text), schema)


def test_logit_bias_cannot_force_a_token_the_grammar_forbids(model, tok):
    ban_all_but_q = {i: -100.0 for i in range(tok.vocab_size) if i != tok.encode("q")[0]}
    config = SampleConfig(regex="[ab]{4}", logit_bias={tok.encode("q")[0]: 100.0}, seed=0, max_new_tokens=10)
    text = generate_text(model, tok, "x", config)
    assert len(text) == 4 and set(text) <= {"a", "b"}
    config = config.replace(logit_bias=ban_all_but_q)
    assert set(generate_text(model, tok, "x", config)) <= {"a", "b"}


def test_an_integer_without_bounds_ends_at_16_digits(model, tok):
    """A model that would write the digit 1 for ever (a greedy SmolLM2 wrote ``"population": 1111…``
    for 150 tokens) gets I-JSON's largest integer's 16 digits at most, then valid JSON and a stop, in a
    reply and in a tool call's arguments alike; a bound the schema gives is kept."""
    from gptlab.tokenizers.tools import Tool, call_grammar

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    one = {tok.encode("1")[0]: 100.0}
    config = SampleConfig(json_schema=schema, logit_bias=one, temperature=0, max_new_tokens=MAX_NEW)
    text = generate_text(model, tok, "x", config)
    assert text == '{"n": ' + "1" * 16 + "}", text
    capped = {**schema, "properties": {"n": {"type": "integer", "maximum": 99}}}
    assert generate_text(model, tok, "x", config.replace(json_schema=capped)) == '{"n": 11}'
    for n in (2**53 - 1, -(2**53 - 1), 2**53, -(2**53)):
        assert accepts(SampleConfig(json_schema=schema), tok, tok.encode(f'{{"n": {n}}}'), complete=True) == (
            abs(n) < 2**53
        )
    grammar = call_grammar([Tool("f", "", schema)], mode="required")
    call = '<tool_call>{{"name": "f", "arguments": {{"n": {}}}}}</tool_call>'
    words = CharTokenizer.from_text(JSON_ALPHABET + "<>/_", special_tokens=["<|endoftext|>"])
    for n, fits in ((2**53 - 1, True), (10**16, False)):
        assert (
            accepts(SampleConfig(grammar=grammar), words, words.encode(call.format(n)), complete=True) == fits
        )


def test_integers_are_bounded_wherever_a_schema_holds_one():
    from gptlab.tokenizers.json_writing import SAFE_INTEGER, as_written

    given = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "exclusiveMinimum": 0},
            "b": {"type": ["integer", "null"], "maximum": 7},
            "c": {"type": "array", "items": {"$ref": "#/$defs/n"}},
            "d": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "e": {"const": {"type": "integer"}, "enum": [{"type": "integer"}]},  # data, not schemas
        },
        "$defs": {"n": {"type": "integer"}},
    }
    written = as_written(given)
    props = written["properties"]
    assert "minimum" not in props["a"] and props["a"]["maximum"] == SAFE_INTEGER
    assert props["b"]["minimum"] == -SAFE_INTEGER and props["b"]["maximum"] == 7
    assert written["$defs"]["n"] == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    assert props["d"]["anyOf"][0]["maximum"] == SAFE_INTEGER and props["d"]["anyOf"][1] == {"type": "string"}
    assert props["e"] == given["properties"]["e"] and "maximum" not in given["$defs"]["n"]  # a copy


def test_regex_and_lark_grammar(model, tok):
    for seed in range(5):
        text = generate_text(
            model, tok, "x", SampleConfig(regex=r"[a-z]{2,5}-[0-9]{3}", seed=seed, max_new_tokens=20)
        )
        assert len(text.split("-")[1]) == 3 and text.split("-")[0].isalpha(), text
    lark = 'start: "yes" | "no" | "n" num\nnum: /[0-9]{2}/'
    answers = {
        generate_text(model, tok, "x", SampleConfig(grammar=lark, seed=s, max_new_tokens=10))
        for s in range(8)
    }
    assert answers and all(
        a in ("yes", "no") or (a[0] == "n" and a[1:].isdigit() and len(a) == 3) for a in answers
    )
    inline = 'start: "ok " %json{"type": "integer", "minimum": 1, "maximum": 3}'
    text = generate_text(model, tok, "x", SampleConfig(grammar=inline, seed=0, max_new_tokens=10))
    assert text.startswith("ok ") and int(text[3:]) in (1, 2, 3)


def test_the_reply_ends_with_stop_without_an_end_of_text_token(model):
    plain = CharTokenizer.from_text(JSON_ALPHABET)  # no <|endoftext|>: unconstrained, it runs to the limit
    m = tiny_model(vocab_size=plain.vocab_size, block_size=128)
    session, rows = start(
        m, plain, [plain.encode("x")], SampleConfig(regex="ab?c", seed=3, max_new_tokens=30), None
    )
    events = list(decode_rows(session, rows))
    assert "".join(e.text for e in events) in ("ac", "abc") and events[-1].finish_reason == "stop"


def test_a_constrained_row_leaves_its_neighbours_tokens_unchanged(model, tok):
    prompts = ["to be", "or not", "data:"]
    plain = SampleConfig(seed=5, max_new_tokens=24, temperature=0.9)
    alone = generate_batch(model, tok, prompts[:2], plain)
    ids = [tok.encode(p) for p in prompts]
    configs = [plain, plain, plain.replace(json_schema=SCHEMAS["nested"])]
    session, rows = start(model, tok, ids, plain, None)
    # the third row's step constrained, as the server's scheduler would build it
    from gptlab.generate.request import RequestState

    rows[2].state = RequestState(configs[2], tok, model, session.tokens[rows[2].slot], index=2)
    out = ["", "", ""]
    for event in decode_rows(session, rows):
        out[event.index] += event.text
    assert out[:2] == alone
    assert accepts(configs[2], tok, tok.encode(out[2]))


def test_plan_routes_a_constrained_request_to_the_per_request_sampler(model):
    plan = prepared_of(model).plan(1, config=SampleConfig(json_schema={"type": "object"}))
    assert plan.sampler == "per-request" and "json_schema" in str(plan)
    from gptlab.generate.plan import DecodeSettings, ModelFacts, plan_decoding

    facts = ModelFacts("cuda", True, 10**9)
    static = plan_decoding(facts, DecodeSettings(), 4, config=SampleConfig())
    assert static.sampler == "in-graph"
    grammar = plan_decoding(facts, DecodeSettings(), 4, config=SampleConfig(regex="a+"))
    assert grammar.sampler == "per-request" and "regex" in grammar.why


# ------------------------------------------------------------------ what may not be asked
def test_config_fields_round_trip_and_validate():
    config = SampleConfig(json_schema=SCHEMAS["nested"])
    assert SampleConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(GptlabError, match="at most one of json_schema, regex and grammar"):
        SampleConfig(json_schema={}, regex="a")
    with pytest.raises(GptlabError, match="beam search"):
        SampleConfig(regex="a+", beam_width=2)
    with pytest.raises(GptlabError, match="json_schema must be a JSON object"):
        SampleConfig(json_schema="{}")  # type: ignore[arg-type]
    with pytest.raises(GptlabError, match="regex must be a non-empty string"):
        SampleConfig(regex="")


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (
            SampleConfig(
                json_schema={"type": "object", "properties": {"a": {"type": "string", "format": "zzz"}}}
            ),
            "zzz",
        ),
        (SampleConfig(json_schema={"type": "nope"}), "nope"),
        (SampleConfig(regex="a(b"), "unclosed group"),
        (SampleConfig(grammar="start: foo"), "foo"),
    ],
)
def test_what_cannot_be_compiled_is_named(model, tok, config, named):
    with pytest.raises(GptlabError, match="could not be compiled") as info:
        generate_text(model, tok, "x", config)
    assert named in str(info.value)


def test_a_language_this_vocabulary_cannot_spell_is_an_error(model):
    letters = CharTokenizer.from_text("abc", special_tokens=["<|endoftext|>"])
    m = tiny_model(vocab_size=letters.vocab_size)
    with pytest.raises(GptlabError, match="allows no token of this vocabulary"):
        generate_text(m, letters, "a", SampleConfig(json_schema={"type": "object"}, max_new_tokens=5))


def test_constraint_mask_allows_stop_ids_only_where_complete(tok):
    config = SampleConfig(regex="ab")
    c = Constraint(config, tok, tok.vocab_size, {tok.eot_id})
    allowed = c.allowed()
    assert allowed.sum() == 1 and allowed[tok.encode("a")[0]] and not allowed[tok.eot_id]
    c.consume(tok.encode("a")[0])
    c.consume(tok.encode("b")[0])
    assert c.done and c.accepting
    assert torch.equal(torch.nonzero(c.allowed()).flatten(), torch.tensor([tok.eot_id]))


def test_a_dead_end_is_an_error_never_a_stop():
    """The engine allows its end-of-text once nothing can follow, complete or not: here after "{"
    (no '"' to write the required key) the reply must not end as if it were whole."""
    braces = CharTokenizer.from_text("{}ab1", special_tokens=["<|endoftext|>"])
    m = tiny_model(vocab_size=braces.vocab_size)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    events = []
    with pytest.raises(GptlabError, match="the json_schema (allows no token|does not allow token)"):
        session, rows = start(m, braces, [braces.encode("a")], SampleConfig(json_schema=schema), None)
        events.extend(decode_rows(session, rows))
    assert "".join(e.text for e in events) == "{" and all(e.finish_reason is None for e in events)
