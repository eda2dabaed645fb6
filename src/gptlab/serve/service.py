"""The service behind the HTTP API, testable without HTTP: requests in, ``Generation``\\ s out.

    parse(body bytes, schema)      JSON → a validated request (OpenAI's error shape on failure)
    completion / chat / generate   a request → prompt ids (cut to leave room for max_tokens)
                                   → SampleConfig per choice → jobs on the scheduler
    Generation.events()            the jobs' TokenEvents and EndEvents, as they come (generation.py)

Chat prompts are built in ``Service.chat_prompt`` with the model's chat template (or ``tokenizers/chat.py``'s
fallback); a chat too long drops its oldest turns (the system message stays). An encoder does not generate.
"""

from __future__ import annotations

import asyncio
import json
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig
from gptlab.generate.grammar import can_spell_json, check_constraint
from gptlab.generate.prefix_cache import budget_of
from gptlab.generate.request import fit_prompt, prompt_budget, token_text, vocab_size
from gptlab.serve import schemas
from gptlab.serve.errors import APIError, not_found_model, validation_error
from gptlab.serve.fields import logit_bias, response_schema
from gptlab.serve.generation import Generation
from gptlab.serve.scheduler import KV_KEEP_S, PREFIX_CACHE_MB, Channel, EndEvent, Job, Scheduler
from gptlab.serve.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerateRequest,
    SamplingFields,
)
from gptlab.serve.tasks import cannot_generate, mask_token, task_of
from gptlab.tokenizers.chat import FALLBACK_STOPS, ChatTemplate, stop_ids, template_for
from gptlab.tokenizers.tools import (
    Tool,
    call_grammar,
    message_problem,
    render_with_tools,
    tool_problem,
    turn_problem,
)

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

M = TypeVar("M", bound=BaseModel)

# Models without a chat template of their own: role-tagged lines (tokenizers/chat.py's "plain").
CHAT_STOP = FALLBACK_STOPS["plain"]  # a base model continues the dialogue by itself; these end the turn
MAX_CHOICES = schemas.MAX_PROMPTS * schemas.MAX_N  # prompts × n per request (each bounded in the schema)
DEFAULT_CAP = 1024  # max_tokens allowed by default (or the context, if larger): the window slides


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: the characters a tool prompt and a call are written in (JSON, the tags): a tokenizer that cannot
#: encode them all (a character tokenizer of a small alphabet) is served without tools
TOOL_CHARS = frozenset(string.printable) - frozenset("\t\r\x0b\x0c")


def _dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role == "tool":
            d["name"] = m.name
        out.append(d)
    return out


def tool_capable(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` can write the tool prompt and calls (every character of ``TOOL_CHARS``)."""
    chars = getattr(tokenizer, "chars", None)
    return chars is None or getattr(tokenizer, "unk", None) is not None or TOOL_CHARS <= set(chars)


@dataclass
class ToolPlan:
    """What a chat request's tools make of it: the tools in the prompt, the names whose calls are read
    back (None: the reply is all text), and the grammar the reply is sampled under (None: free)."""

    tools: list[Tool]
    names: set[str] | None
    grammar: str | None


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """The plain chat template: ``"system: …\\nuser: …\\nassistant:"``.

    >>> chat_prompt([ChatMessage(role="user", content="hi")])
    'user: hi\\nassistant:'
    """
    return ChatTemplate.named("plain").render(_dicts(messages))


class Service:
    """The model, its tokenizer and a scheduler, with the rules every endpoint shares."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        *,
        model_name: str = "gptlab",
        max_batch: int = 8,
        max_tokens_cap: int | None = None,
        max_body_bytes: int = 1 << 20,
        prefix_cache_mb: float = PREFIX_CACHE_MB,
        kv_keep_s: float = KV_KEEP_S,
    ) -> None:
        if tokenizer is None:
            raise GptlabError(
                "the checkpoint has no tokenizer.json; serving needs a tokenizer to turn text into ids"
            )
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.task = task_of(model)  # "generate", or "fill-mask" for a masked-language encoder
        self.context = model.config.block_size
        self.cap = max_tokens_cap if max_tokens_cap is not None else max(self.context, DEFAULT_CAP)
        if self.cap < 1:
            raise GptlabError(f"max_tokens_cap must be at least 1, got {self.cap}")
        self.max_body_bytes = max_body_bytes
        self.chat_template = template_for(tokenizer)  # the model's own, else a fallback (tokenizers/chat.py)
        self.tools = tool_capable(tokenizer)  # can the prompt offer tools and the model write calls?
        self.json_output = can_spell_json(tokenizer)  # response_format json_object / json_schema possible
        self.created = int(time.time())
        model.eval()
        self.scheduler = Scheduler(
            model, tokenizer, max_batch, prefix_cache_bytes=budget_of(prefix_cache_mb), kv_keep_s=kv_keep_s
        )

    def close(self) -> None:
        self.scheduler.close()

    # ------------------------------------------------------------ what the server allows
    def default_max_tokens(self) -> dict[str, int]:
        return {
            "completions": min(16, self.cap),
            "chat": min(self.context, self.cap),
            "generate": min(200, self.cap),
        }

    def limits(self) -> dict[str, Any]:
        """Everything a client must know not to be refused (``GET /v1/gptlab/limits``)."""
        return {
            "object": "gptlab.limits",
            "model": self.model_name,
            "context_length": self.context,
            "max_tokens": self.cap,
            "default_max_tokens": self.default_max_tokens(),
            "sliding_window": True,
            "max_choices": MAX_CHOICES,
            "max_prompts": schemas.MAX_PROMPTS,
            "max_n": schemas.MAX_N,
            "max_logprobs": schemas.MAX_LOGPROBS,
            "max_top_logprobs": schemas.MAX_TOP_LOGPROBS,
            "max_top_n": schemas.MAX_TOP_N,
            "max_attention_tokens": min(schemas.MAX_ATTENTION_TOKENS, self.context),
            "max_inside_tokens": min(schemas.MAX_INSIDE_TOKENS, self.context),
            "max_body_bytes": self.max_body_bytes,
            "vocab_size": self.tokenizer.vocab_size,
            "n_layer": self.model.config.n_layer,
            "task": self.task,
            "mask_token": mask_token(self.tokenizer),
        }

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "gptlab",
            "context_length": self.context,
            "vocab_size": self.tokenizer.vocab_size,
        }

    def health(self) -> dict[str, Any]:
        stats = {"status": "ok", "model": self.model_name, "n_layer": self.model.config.n_layer}
        return {**stats, **self.scheduler.stats()}  # load, and the prefix cache's counters

    # ------------------------------------------------------------ requests
    def parse(self, raw: bytes, cls: type[M]) -> M:
        """A request body → a validated ``cls`` (what the routes get from FastAPI, without HTTP)."""
        try:
            data = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"malformed JSON in the request body: {exc}", code="invalid_json") from None
        except RecursionError:
            raise APIError(
                400, "the request body is nested too deeply to be a request", code="invalid_json"
            ) from None
        try:
            return self.check_model(cls.model_validate(data))
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None

    def check_model(self, req: M) -> M:
        """``req`` if its ``model`` is absent or the one served, else a 404."""
        asked = getattr(req, "model", None)
        if asked not in (None, self.model_name):
            raise not_found_model(asked, self.model_name)
        return req

    def encode(self, text: str, param: str) -> list[int]:
        try:
            return self.tokenizer.encode(text, allowed_special="all")
        except GptlabError as exc:
            raise APIError(400, f"{param}: {exc}", param=param) from None

    def prompt_ids(self, ids: list[int], label: str, max_tokens: int, warnings: list[str]) -> list[int]:
        """Check ``ids``; an empty prompt starts from end-of-text; a long one is cut from the left."""
        vocab = self.tokenizer.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise APIError(
                400, f"{label}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt"
            )
        if not ids:
            if self.tokenizer.eot_id is None:
                raise APIError(400, f"{label} is empty; give at least one token of text", param="prompt")
            return [self.tokenizer.eot_id]  # an empty prompt starts from end-of-text, like GPT-2
        ids, message = fit_prompt(ids, self.context, max_tokens, label)
        if message:
            warnings.append(message)
        return ids

    def max_tokens(self, req: SamplingFields, default: int) -> int:
        """The tokens to generate: chat's ``max_completion_tokens``, else ``max_tokens``; each ≤ the cap."""
        given = {
            "max_tokens": req.max_tokens,
            "max_completion_tokens": getattr(req, "max_completion_tokens", None),
        }
        for name, value in given.items():
            if value is not None and value > self.cap:
                raise APIError(
                    400,
                    f"{name}={value} is more than this server allows ({self.cap}); "
                    f"ask for at most {self.cap} tokens (GET /v1/gptlab/limits lists every limit)",
                    param="max_tokens",
                )
        chosen = (
            given["max_completion_tokens"] if given["max_completion_tokens"] is not None else req.max_tokens
        )
        return default if chosen is None else chosen

    def sample_config(
        self,
        req: SamplingFields,
        max_tokens: int,
        stop: list[str],
        seed: int | None,
        grammar: str | None = None,
    ) -> SampleConfig:
        try:
            return SampleConfig(
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                top_k=req.top_k or None,  # OpenAI-style "off" values (0, 1.0, 0.0) mean no truncation
                top_p=req.top_p if req.top_p < 1.0 else None,
                min_p=req.min_p or None,
                repetition_penalty=req.repetition_penalty,
                frequency_penalty=req.frequency_penalty,
                presence_penalty=req.presence_penalty,
                beam_width=req.beam_width,
                length_penalty=req.length_penalty,
                early_stopping=req.early_stopping,
                stop=stop,
                stop_tokens=stop_ids(self.tokenizer),  # eos and end-of-turn tokens (<|im_end|> …)
                seed=seed,
                logit_bias=logit_bias(req, self.tokenizer),
                json_schema=response_schema(req, self.tokenizer, self.model, self.json_output),
                grammar=grammar,
            )
        except GptlabError as exc:
            raise APIError(400, str(exc)) from None

    def start(
        self,
        req: SamplingFields,
        prompts: list[list[int]],
        max_tokens: int,
        stop: list[str],
        *,
        top_n: int | None = None,
        warnings: list[str] | None = None,
        grammar: str | None = None,
    ) -> Generation:
        """One job per prompt × ``n`` on the scheduler (choice ``p·n + i``, seed ``seed + i``); with
        ``grammar`` (llguidance's Lark), every choice is sampled under it."""
        if self.task != "generate":  # a masked-language encoder: every generating endpoint comes here
            raise cannot_generate(self.model_name)
        if top_n is not None and req.beam_width > 1:
            raise APIError(
                400, "logprobs are not available with beam search (beam_width > 1)", param="logprobs"
            )
        configs = [
            self.sample_config(
                req, max(max_tokens, 1), stop, None if req.seed is None else req.seed + i, grammar=grammar
            )
            for i in range(req.n)
        ]
        channel = Channel(asyncio.get_running_loop())
        jobs = [
            Job(ids, configs[i], channel, index=p * req.n + i, top_n=top_n)
            for p, ids in enumerate(prompts)
            for i in range(req.n)
        ]
        gen = Generation(channel, jobs, sum(map(len, prompts)), warnings or [])
        if max_tokens == 0:  # nothing to generate: answer at once
            for job in jobs:
                job.ended = True
                channel.put(EndEvent(job.index, "length", 0))
            return gen
        for job in jobs:
            self.scheduler.submit(job)
        return gen

    # ------------------------------------------------------------ the three generating endpoints
    def completion(self, req: CompletionRequest) -> Generation:
        """``/v1/completions``: prompt as text, texts, token ids, or lists of token ids."""
        raw = req.prompt
        if isinstance(raw, str):
            items: list[str | list[int]] = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            items = [list(raw)]  # type: ignore[arg-type]
        else:
            items = list(raw)  # type: ignore[arg-type]
        if not items:
            raise APIError(400, "prompt is an empty list; give a string or a list of strings", param="prompt")
        max_tokens = self.max_tokens(req, self.default_max_tokens()["completions"])
        warnings: list[str] = []
        prompts = []
        scored = req.echo and req.logprobs is not None  # every prompt token is reported: none may be cut
        for p, item in enumerate(items):
            label = "prompt" if len(items) == 1 else f"prompt[{p}]"
            ids = self.encode(item, "prompt") if isinstance(item, str) else item
            if scored and len(ids) > self.context:
                raise APIError(
                    400,
                    f"{label}: echo with logprobs scores every prompt token, and {len(ids)} tokens are more "
                    f"than the context of {self.context}; shorten the prompt",
                    param="prompt",
                )
            prompts.append(self.prompt_ids(ids, label, 0 if scored else max_tokens, warnings))
        gen = self.start(req, prompts, max_tokens, req.stop_list(), top_n=req.logprobs, warnings=warnings)
        gen.texts = [
            item if isinstance(item, str) else self.tokenizer.decode(ids)
            for item, ids in zip(items, prompts, strict=True)
        ]
        return gen

    def chat(self, req: ChatCompletionRequest) -> Generation:
        """``/v1/chat/completions``: the messages through the chat template, stopping at the end of the turn."""
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        max_tokens = self.max_tokens(req, self.default_max_tokens()["chat"])
        plan = self.tool_plan(req)
        warnings: list[str] = []
        if (order := turn_problem(_dicts(req.messages))) is not None:
            # OpenAI's API refuses such a chat; a schema cannot say so (it relates one message to the
            # next), so it is served as the template writes it, with this said
            warnings.append(f"{order[1]} (OpenAI's API refuses this order)")
        ids = self.chat_ids(req.messages, max_tokens, warnings, plan.tools)
        top_n = (req.top_logprobs or 0) if req.logprobs else None
        gen = self.start(
            req,
            [ids],
            max_tokens,
            [*req.stop_list(), *self.chat_template.stop_strings],
            top_n=top_n,
            warnings=warnings,
            grammar=plan.grammar,
        )
        gen.tool_names = plan.names
        return gen

    def tool_plan(self, req: ChatCompletionRequest) -> ToolPlan:
        """The request's tools checked (a 400 names what is wrong) and what they make of the reply.

        ``tool_choice`` ``"none"`` (or no tools): nothing offered, a text reply. ``"auto"`` (the default
        with tools): offered; the model writes text or calls, and a call, once started, follows its
        grammar. ``"required"``: one call or more from the first token; a named function: calls of it.
        ``parallel_tool_calls=false``: exactly one call.
        """
        if req.tool_choice is not None and req.tools is None:
            raise APIError(
                400, "tool_choice needs tools: give the functions to choose from", param="tool_choice"
            )
        if not self.tools and (req.tools or any(m.tool_calls for m in req.messages)):
            raise APIError(
                400,
                f"{self.model_name!r} cannot take tools: its tokenizer cannot write a call's characters "
                "(JSON and the <tool_call> tags)",
                param="tools",
            )
        tools = [
            Tool(
                t.function.name,
                t.function.description or "",
                t.function.parameters
                if t.function.parameters is not None
                else {"type": "object", "properties": {}},
                bool(t.function.strict),
            )
            for t in req.tools or []
        ]
        own = [m.model_dump(include={"role", "tool_calls", "tool_call_id"}) for m in req.messages]
        if (problem := tool_problem(tools) or message_problem(own)) is not None:
            param, message = problem
            raise APIError(400, message, param=param)
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
        only = None
        if not isinstance(choice, str):
            only = choice.function.name
            if only not in {t.name for t in tools}:
                raise APIError(
                    400,
                    f"tool_choice names the function {only!r}, which is not in tools "
                    f"({', '.join(t.name for t in tools)})",
                    param="tool_choice",
                )
            choice = "required"
        if tools and req.json_schema() is not None:
            raise APIError(
                400,
                "response_format json_object / json_schema and tools cannot both shape one reply; "
                "send one of them",
                param="response_format",
            )
        if choice == "none":
            return ToolPlan([], None, None)
        if req.beam_width > 1:
            raise APIError(
                400, "tools are not available with beam search (beam_width > 1)", param="beam_width"
            )
        grammar = self.tool_constraint(tools, choice, req.parallel_tool_calls, only)
        names = {t.name for t in tools if only is None or t.name == only}
        return ToolPlan(tools, names, grammar)

    def tool_constraint(self, tools: list[Tool], choice: str, parallel: bool, only: str | None) -> str | None:
        """The grammar a reply is sampled under (``tokenizers.tools.call_grammar``: llguidance's Lark),
        compiled here (cached by the engine) so that parameters it cannot take are a 400 naming the
        function, before any job starts."""
        try:
            grammar = call_grammar(tools, mode=choice, parallel=parallel, only=only)
        except GptlabError as exc:
            raise APIError(400, f"tools: {exc}", param="tools") from None
        try:
            check_constraint(
                SampleConfig(grammar=grammar), self.tokenizer, vocab_size(self.model, self.tokenizer)
            )
        except GptlabError:  # which function: compile each one's arguments alone
            for i, tool in enumerate(tools):
                try:
                    one = call_grammar([tool], mode="required")
                    check_constraint(
                        SampleConfig(grammar=one), self.tokenizer, vocab_size(self.model, self.tokenizer)
                    )
                except GptlabError as exc:
                    raise APIError(
                        400, f"tools.{i}.function.parameters: {exc}", param=f"tools.{i}.function.parameters"
                    ) from None
            raise
        return grammar

    def generate(self, req: GenerateRequest) -> Generation:
        """``/v1/gptlab/generate`` (the playground): one prompt, with probabilities per token."""
        max_tokens = self.max_tokens(req, self.default_max_tokens()["generate"])
        warnings: list[str] = []
        ids = self.prompt_ids(self.encode(req.prompt, "prompt"), "prompt", max_tokens, warnings)
        return self.start(req, [ids], max_tokens, req.stop_list(), top_n=req.top_n, warnings=warnings)

    # ------------------------------------------------------------ chat
    def chat_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> str:
        """The one place a chat becomes a prompt: the model's chat template (``tokenizers/chat.py``),
        with ``tools`` offered and earlier calls and results written as ``tokenizers/tools.py`` says."""
        try:
            return render_with_tools(self.chat_template, _dicts(messages), tools)
        except GptlabError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from None

    def chat_ids(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int,
        warnings: list[str],
        tools: Sequence[Tool] = (),
    ) -> list[int]:
        """The chat's prompt ids; a chat too long for the context drops its oldest turns first.

        System (and developer) messages and the last message stay; the kept turns start at a user
        message. The fewest turns to drop are found by bisection (a few renders, whatever the
        template). If what is left is still too long, the prompt is cut from the left like any other.
        """
        budget = prompt_budget(self.context, max_tokens)
        ids = self.encode(self.chat_prompt(messages, tools), "messages")
        if len(ids) > budget:
            last = len(messages) - 1
            turns = [i for i, m in enumerate(messages[:last]) if m.role not in ("system", "developer")]
            starts = [k for k, i in enumerate(turns) if k and messages[i].role == "user"] + [len(turns)]

            def render(start: int) -> list[int] | None:  # None: the template refuses what is left
                dropped = set(turns[:start])
                try:
                    return self.encode(
                        self.chat_prompt([m for i, m in enumerate(messages) if i not in dropped], tools),
                        "messages",
                    )
                except APIError:
                    return None

            lo, hi = 0, len(starts) - 1  # the first start whose prompt fits (or the last one)
            while lo < hi:
                mid = (lo + hi) // 2
                fewer = render(starts[mid])
                if fewer is not None and len(fewer) <= budget:
                    hi = mid
                else:
                    lo = mid + 1
            fewer = render(starts[lo]) if starts[lo] else None
            if fewer is not None:  # else: the whole chat, cut from the left below
                ids = fewer
                warnings.append(
                    f"the chat does not fit the context (block_size={self.context}) with room for "
                    f"{max_tokens} tokens; its {starts[lo]} oldest message(s) were left out "
                    f"(system messages stay)"
                )
        return self.prompt_ids(ids, "the chat prompt", max_tokens, warnings)

    # ------------------------------------------------------------ the playground's extras
    def token_texts(self, ids: Sequence[int]) -> list[str]:
        return [token_text(self.tokenizer, i) for i in ids]
